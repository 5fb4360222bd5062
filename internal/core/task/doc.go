// Package task is a task's life in one place: every transition of a task's
// state (SPEC §2–§9) as a pure function of the state, the event that moves
// it, the type's policy and the time, returning the new state and a typed
// Cause — what the transition did, or why it did nothing. It does no I/O:
// the services read and write the dispatch_tasks bucket around these
// functions (inside one compare-and-set), the review commands call them for
// human actions, and `dispatch rebuild` folds the stream through the very
// same functions, so the live stores and a replay cannot disagree about a
// transition.
//
// The transitions, in a task's order:
//
//	New, Queued             submitted: the state of an accepted task
//	SetStatus, Verifying    a stage takes the task for a pass
//	Cancel                  the verifier found it stale (or failed closed)
//	Block, HandOff          the gate stopped it (needs_human_review, blocked)
//	Begin                   the executor starts an attempt
//	CutShort, Settle,       facts of an attempt: a try cut short, the
//	AddFailed, AddRefused,  attempt over, a banned request, a refused one,
//	Abandon                 the attempt dropped for a human's cancel
//	Record                  the recorder folds an outcome in and decides
//	                        (Judge, Apply: the ladder or the pipeline)
//	Act                     a human resolves, rejects, requeues or cancels
//
// Each function taking found (whether the task had a state) makes the state
// of an unknown task with New first, as the stores do.
package task
