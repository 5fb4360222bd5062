package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/spend"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// seedTasks starts an embedded JetStream with the task store holding
// states, and points the CLI at it.
func seedTasks(t *testing.T, states ...events.TaskState) {
	t.Helper()
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stores, err := services.Provision(ctx, srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tasks := services.NewTaskStore(stores.Tasks)
	for _, st := range states {
		if created, _, err := tasks.Create(ctx, st); err != nil || !created {
			t.Fatalf("seed %s: created %v, %v", st.ID, created, err)
		}
	}
	t.Setenv("NATS_URL", srv.ClientURL())
}

func dispatch(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var buf bytes.Buffer
	old := stdout
	stdout = &buf
	defer func() { stdout = old }()
	err := run(context.Background(), args)
	return buf.String(), err
}

// seeded is a task state with attempts: outcome letters s (success), f
// (failure, reason "same") and r (refused), each 1000 prompt and 100
// completion tokens for $0.01 unless refused.
func seeded(id, typ string, status events.Status, attempts string) events.TaskState {
	st := events.TaskState{ID: id, Type: typ, Subject: id + ".css", Status: status, Pass: 1}
	for i, c := range attempts {
		r := events.AttemptRecord{Attempt: i + 1, Pass: i + 1, Rung: events.RungRefine, Outcome: events.OutcomeFailure,
			Reason: "same", ErrorClass: events.ErrorClassTask, TokensIn: 1000, TokensOut: 100, Cost: 0.01}
		switch c {
		case 's':
			r.Outcome, r.Reason, r.ErrorClass = events.OutcomeSuccess, "", ""
		case 'r':
			r.Reason, r.ErrorClass, r.TokensIn, r.TokensOut, r.Cost = "refused: repeat", events.ErrorClassRefused, 0, 0, 0
		}
		if i >= 2 {
			r.Rung = events.RungPivot
		}
		st.History = append(st.History, r)
		st.TokensIn, st.TokensOut, st.Cost = st.TokensIn+r.TokensIn, st.TokensOut+r.TokensOut, st.Cost+r.Cost
		st.Attempts, st.Pass = i+1, i+1
	}
	return st
}

func seedMix(t *testing.T) {
	seedTasks(t,
		seeded("css-1", "css_fix", events.StatusSucceeded, "s"),
		seeded("css-2", "css_fix", events.StatusSucceeded, "ffs"),
		seeded("css-3", "css_fix", events.StatusBlocked, "ffr"),
		seeded("css-4", "css_fix", events.StatusRunning, "f"),
		seeded("bug-1", "bug_fix", events.StatusCancelled, ""),
	)
}

func TestStatsJSON(t *testing.T) {
	seedMix(t)
	out, err := dispatch(t, "stats", "-o", "json")
	if err != nil {
		t.Fatalf("stats: %v\n%s", err, out)
	}
	var r spend.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(r.Types) != 2 || r.Types[0].Type != "bug_fix" || r.Types[1].Type != "css_fix" {
		t.Fatalf("types = %+v", r.Types)
	}
	css := r.Types[1]
	// 4 tasks: two resolved (1 and 3 attempts), one blocked after 2
	// failures and a refusal, one running.
	checks := []struct {
		name      string
		got, want float64
	}{
		{"tasks", float64(css.Tasks), 4},
		{"open", float64(css.Open), 1},
		{"resolved", float64(css.Resolved), 2},
		{"unresolved", float64(css.Unresolved), 1},
		{"attempts", float64(css.Attempts), 8},
		{"wasted tokens", float64(css.WastedTokens), 2200},
		{"wasted cost", css.WastedCost, 0.02},
		{"retries", float64(css.Retries), 4},
		{"retry successes", float64(css.RetrySuccesses), 1},
		{"same-error retries", float64(css.SameErrorRetries), 2},
		{"refused", float64(css.Refused), 1},
		{"loop rate", *css.LoopRate, 2},
		{"cost per resolved", *css.CostPerResolved, 0.02},
		{"tokens per resolved", *css.TokensPerResolved, 2200},
		{"retry success rate", *css.RetrySuccessRate, 0.25},
		{"repeat-call rate", *css.RepeatCallRate, 0.125},
		{"REFINE prompt tokens per attempt", *css.Rungs[string(events.RungRefine)].PromptTokensPerAttempt, 1000},
		{"PIVOT attempts", float64(css.Rungs[string(events.RungPivot)].Attempts), 2},
		{"total tasks", float64(r.Total.Tasks), 5},
		{"total unresolved", float64(r.Total.Unresolved), 2},
	}
	for _, c := range checks {
		if d := c.got - c.want; d > 1e-9 || d < -1e-9 {
			t.Errorf("css_fix %s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if bug := r.Types[0]; bug.Unresolved != 1 || bug.WastedCost != 0 || bug.LoopRate != nil || bug.RepeatCallRate != nil {
		t.Errorf("bug_fix = %+v, want one cancelled task, nothing spent, no rates", bug)
	}
	if !strings.Contains(out, `"loop_rate": null`) {
		t.Errorf("a rate without denominator is not null in JSON:\n%s", out)
	}
}

func TestStatsText(t *testing.T) {
	seedMix(t)
	out, err := dispatch(t, "stats")
	if err != nil {
		t.Fatalf("stats: %v\n%s", err, out)
	}
	// TYPE TASKS OPEN RESOLVED UNRESOLVED COST TOKENS WASTED-COST WASTED-TOKENS
	// COST/RESOLVED TOKENS/RESOLVED LOOP RETRY-OK REPEAT SAME-ERROR
	for _, row := range []string{
		`(?m)^css_fix\s+4\s+1\s+2\s+1\s+\$0\.0700\s+7700\s+\$0\.0200\s+2200\s+\$0\.0200\s+2200\s+2\.00\s+1/4 25%\s+1/8 12%\s+2$`,
		`(?m)^bug_fix\s+1\s+0\s+0\s+1\s+\$0\.0000\s+0\s+\$0\.0000\s+0\s+-\s+-\s+-\s+-\s+-\s+0$`,
		`(?m)^\(all\)\s+5\s+1\s+2\s+2\s+`,
		`(?m)^css_fix\s+REFINE\s+6\s+6\s+1000$`,
		`(?m)^css_fix\s+PIVOT\s+2\s+1\s+1000$`,
		`(?m)^wasted: spent by tasks that ended unresolved`,
	} {
		if !regexp.MustCompile(row).MatchString(out) {
			t.Errorf("no line matching %s in\n%s", row, out)
		}
	}
	if strings.Contains(out, "bug_fix  none") {
		t.Errorf("a rung row for a task without attempts:\n%s", out)
	}
}

func TestStatsOfOneType(t *testing.T) {
	seedMix(t)
	out, err := dispatch(t, "stats", "-type", "bug_fix")
	if err != nil {
		t.Fatalf("stats: %v\n%s", err, out)
	}
	if strings.Contains(out, "css_fix") || strings.Contains(out, "(all)") || !strings.Contains(out, "bug_fix") {
		t.Errorf("stats -type bug_fix:\n%s", out)
	}
	out, err = dispatch(t, "stats", "-type", "none_such")
	if err != nil || strings.TrimSpace(out) != "no tasks" {
		t.Errorf("stats of a type without tasks = %q, %v", out, err)
	}
	for _, args := range [][]string{{"stats", "-o", "yaml"}, {"stats", "-type", "no spaces"}, {"stats", "extra"}} {
		if _, err := dispatch(t, args...); err == nil {
			t.Errorf("dispatch %v: no error", args)
		}
	}
}
