package spendbench

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
)

// Task is one task of a workload: its type is its scenario.
type Task struct {
	ID       string          `json:"id"`
	Scenario string          `json:"scenario"`
	Subject  string          `json:"subject"`
	Payload  json.RawMessage `json:"payload"`
}

// Workload configures Generate.
type Workload struct {
	// Tasks is how many tasks. Default 300.
	Tasks int
	// Mix is the share of each scenario. Default DefaultMix.
	Mix []Share
	// ContextTokens sizes the filler "context" text of every payload, in
	// tokens of about 4 characters. Default 1000; negative means none.
	ContextTokens int
	// RepeatSubjects is the probability that a task reuses the subject of
	// an earlier task of its type (so its prompt carries that task's
	// outcomes). Default 0.15; negative means never.
	RepeatSubjects float64
	// Seed makes the workload reproducible. Default 1.
	Seed uint64
	// Prefix starts every task id. Default "sb".
	Prefix string
}

func (w Workload) withDefaults() Workload {
	if w.Tasks <= 0 {
		w.Tasks = 300
	}
	if len(w.Mix) == 0 {
		w.Mix = DefaultMix
	}
	if w.ContextTokens == 0 {
		w.ContextTokens = 1000
	}
	if w.RepeatSubjects == 0 {
		w.RepeatSubjects = 0.15
	}
	if w.Seed == 0 {
		w.Seed = 1
	}
	if w.Prefix == "" {
		w.Prefix = "sb"
	}
	return w
}

// Generate makes the workload: the scenarios in the proportions of the mix
// (largest remainder, so the counts add up to Tasks), in a shuffled order,
// each with a subject (mostly distinct per type, some repeated) and a
// payload carrying the scenario, the ticket (the task id), an issue line and
// the filler context. The same Workload always gives the same tasks.
func Generate(w Workload) []Task {
	w = w.withDefaults()
	rng := rand.New(rand.NewPCG(w.Seed, 0x5bd1e995))
	scenarios := apportion(w.Mix, w.Tasks)
	rng.Shuffle(len(scenarios), func(i, j int) { scenarios[i], scenarios[j] = scenarios[j], scenarios[i] })

	subjects := map[string][]string{}
	tasks := make([]Task, len(scenarios))
	for i, sc := range scenarios {
		id := fmt.Sprintf("%s-%04d", w.Prefix, i+1)
		var subject string
		if prev := subjects[sc]; len(prev) > 0 && rng.Float64() < w.RepeatSubjects {
			subject = prev[rng.IntN(len(prev))]
		} else {
			subject = fmt.Sprintf("src/%s/%s_%d.go", sc, words[rng.IntN(len(words))], len(prev)+1)
			subjects[sc] = append(prev, subject)
		}
		payload := map[string]string{
			"scenario": sc,
			"ticket":   id,
			"issue":    fmt.Sprintf("%s (scenario=%s ticket=%s)", issues[rng.IntN(len(issues))], sc, id),
		}
		if w.ContextTokens > 0 {
			payload["context"] = filler(rng, w.ContextTokens*4)
		}
		data, err := json.Marshal(payload)
		if err != nil {
			panic(err) // a map of strings always encodes
		}
		tasks[i] = Task{ID: id, Scenario: sc, Subject: subject, Payload: data}
	}
	return tasks
}

// apportion returns n scenario names in the mix's proportions.
func apportion(mix []Share, n int) []string {
	total := 0.0
	for _, s := range mix {
		total += max(s.Percent, 0)
	}
	type part struct {
		name string
		n    int
		rem  float64
	}
	parts := make([]part, len(mix))
	given := 0
	for i, s := range mix {
		exact := float64(n) * max(s.Percent, 0) / total
		parts[i] = part{name: s.Scenario, n: int(math.Floor(exact)), rem: exact - math.Floor(exact)}
		given += parts[i].n
	}
	order := make([]int, len(parts))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case parts[a].rem > parts[b].rem:
			return -1
		case parts[a].rem < parts[b].rem:
			return 1
		}
		return 0
	})
	for i := 0; given < n; i++ {
		parts[order[i%len(order)]].n++
		given++
	}
	out := make([]string, 0, n)
	for _, p := range parts {
		for range p.n {
			out = append(out, p.name)
		}
	}
	return out
}

// filler is about chars characters of plausible log and code text, with
// nothing a prompt would have to escape.
func filler(rng *rand.Rand, chars int) string {
	var b strings.Builder
	for b.Len() < chars {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()
}

var issues = []string{
	"the settings page crashes when the profile has no avatar",
	"the export job times out on large accounts",
	"a button is misaligned by 3px in the checkout form",
	"login fails intermittently behind the corporate proxy",
	"the nightly report double counts refunded orders",
	"search returns stale results after an index rebuild",
	"the mobile menu does not close after navigation",
	"uploads larger than 10 MB are silently truncated",
}

var words = strings.Fields(`handler request response config loader cache entry module service client
server timeout retry queue worker stream consumer producer index query schema migration table column
row record field value parser encoder decoder buffer reader writer socket session token header cookie
profile account order invoice refund payment checkout cart product catalog search filter sort page
layout button menu modal form input label selector style theme render template component state
store reducer action effect hook route path param status error panic trace stack frame line file
function method struct interface pointer slice map channel mutex lock goroutine context deadline
cancel signal metric gauge counter histogram log level debug info warn`)
