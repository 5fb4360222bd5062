// Package spendbench measures what dispatching a mixed workload to an LLM
// costs, through the mesh and through a naive stateless retry loop, against
// a scripted OpenAI-compatible server that bills like the real API: an error
// answer is free, a 200 answer bills the characters of every message / 4 as
// prompt tokens and the answer's characters / 4 as completion tokens.
//
// Every figure is measured from outside the mesh: the server keeps a ledger
// of every call per task (when, what status, what it billed, the hash of the
// request body, whether the answer was transient), and the mesh's own task
// states are read only to learn how each task ended and to cross-check the
// mesh's attempt count against the calls the server saw.
//
// The server answers from the request alone. Each task's payload carries
// "scenario" and "ticket"; the server finds them in the message contents and
// answers according to the scenario and the calls it already saw for that
// ticket (see Scenario). Nothing here knows how the mesh decides: a
// scenario succeeds when the request shows what a careful client would have
// done (carried the provider's error, or the previous attempt's summary,
// into the next request), never because a particular mechanism ran.
//
// Workloads come in shapes (Shapes): today's default mix (one type per
// behaviour); a steady stream of 8 types whose subjects recur; a small
// mixed batch of 42 tasks; a long tail of 40 new types of 5 tasks each,
// healthy, hopeless or of mixed difficulty; and a regression, one type
// healthy, then hopeless, then healthy again, beside two control types,
// delivered in order. The server needs nothing new for them: a task's
// type and its scenario are two fields (Task.Type, Task.Scenario), so one
// type can mix scenarios and the generator alone decides which ticket is
// in which phase. Each task may carry a report class (Task.Class: the long
// tail's healthy / mixed / hopeless, the regression's before / broken /
// after_fix / control), and every figure is also given per class. Prompts
// are short (the issue line alone) or long (≈1,000 tokens of context).
//
// Run compares the two runners on one generated workload (Generate) in one
// delivery mode (all at once, or at a steady rate); Summarize folds several
// runs into medians; Report prints them. `dispatch bench spend` and
// BenchmarkSpend are the two ways to run it.
package spendbench
