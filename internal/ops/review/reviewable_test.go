package review

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
)

func TestCheckReviewable(t *testing.T) {
	for _, c := range []struct {
		name   string
		status events.Status
		pass   int
		tail   tail
		ok     bool
		says   string
	}{
		{"gated", events.StatusNeedsHumanReview, 1, tail{"review.gated", 1}, true, ""},
		{"escalated", events.StatusBlocked, 3, tail{"review.escalated", 3}, true, ""},
		{"stuck", events.StatusBlocked, 5, tail{"review.stuck", 5}, true, ""},
		{"rejected by a human", events.StatusFailed, 2, tail{"review.action", 0}, true, ""},
		{"stale", events.StatusCancelled, 1, tail{events.StageCancelled, 1}, true, ""},
		{"poison of the current pass", events.StatusRunning, 2, tail{"review.poison", 2}, true, ""},
		{"poison while verifying", events.StatusVerifying, 1, tail{"review.poison", 1}, true, ""},
		{"poison of an old pass", events.StatusRunning, 3, tail{"review.poison", 2}, false, "running (pass 3)"},
		// A record from before Dispatch-Pass whose body does not decode
		// (issue 9: a queued event nested too deep for the verifier).
		{"poison without a pass", events.StatusPending, 1, tail{"review.poison", 0}, true, ""},
		{"rejected resubmission", events.StatusRunning, 1, tail{"review.rejected", 1}, false, "running"},
		{"pending", events.StatusPending, 2, tail{events.StageRetry, 2}, false, "pending (pass 2)"},
		{"running", events.StatusRunning, 1, tail{events.StagePrompted, 1}, false, "the mesh is working on it"},
		{"parked", events.StatusParked, 1, tail{events.StageRetry, 2}, false, "comes back by itself"},
		{"succeeded", events.StatusSucceeded, 1, tail{events.StageSucceeded, 1}, false, "already succeeded"},
		{"succeeded after poison", events.StatusSucceeded, 1, tail{"review.poison", 1}, false, "already succeeded"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := checkReviewable(events.TaskState{ID: "t-1", Status: c.status, Pass: c.pass}, c.tail, events.ActionRequeue)
			if c.ok {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrNotReviewable) {
				t.Fatalf("err = %v, want ErrNotReviewable", err)
			}
			if !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "cannot requeue task t-1") {
				t.Errorf("error %q does not say %q", err, c.says)
			}
		})
	}
}

// A recorder whose outcome was poisoned after it had written the task's
// next pass (pending, or parked) never published that pass: the task can
// be requeued. Once the next pass moved the task, it cannot.
func TestPoisonedOutcomeOfARecordedRetryIsReviewable(t *testing.T) {
	recorded := events.TaskState{ID: "t-1", Status: events.StatusPending, Decision: events.DecisionRetry, Pass: 3,
		History: []events.AttemptRecord{{Attempt: 1, Pass: 1}, {Attempt: 2, Pass: 2}}}
	if err := checkReviewable(recorded, tail{"review.poison", 2}, events.ActionRequeue); err != nil {
		t.Fatalf("refused: %v", err)
	}
	parked := recorded
	parked.Status, parked.Decision = events.StatusParked, events.DecisionPark
	if err := checkReviewable(parked, tail{"review.poison", 2}, events.ActionRequeue); err != nil {
		t.Fatalf("parked: refused: %v", err)
	}
	moved := recorded
	moved.Status = events.StatusRunning // pass 3 began: its retry was published
	if err := checkReviewable(moved, tail{"review.poison", 2}, events.ActionRequeue); !errors.Is(err, ErrNotReviewable) {
		t.Fatalf("err = %v, want ErrNotReviewable once the next pass runs", err)
	}
}

func TestHandledBy(t *testing.T) {
	t0 := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	rec := Record{Seq: 10, Time: t0}
	act := func(by string, at time.Time) events.Action { return events.Action{Action: "requeue", By: by, At: at} }
	for _, c := range []struct {
		name string
		ds   []decision
		want string // By of the handling decision, "" for none
	}{
		{"none", nil, ""},
		{"before the record", []decision{{seq: 5, a: act("a", t0.Add(time.Hour))}}, ""},
		{"after the record", []decision{{seq: 11, a: act("a", t0)}}, "a"},
		{"first of two", []decision{{seq: 12, a: act("b", t0.Add(2*time.Minute))}, {seq: 11, a: act("a", t0.Add(time.Minute))}}, "a"},
		{"state only, later", []decision{{a: act("s", t0.Add(time.Second))}}, "s"},
		{"state only, earlier", []decision{{a: act("s", t0.Add(-time.Second))}}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := handledBy(rec, c.ds)
			if (got == nil) != (c.want == "") || (got != nil && got.By != c.want) {
				t.Fatalf("handledBy = %+v, want by %q", got, c.want)
			}
		})
	}
}

func TestMergePlacesStateDecisions(t *testing.T) {
	at := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	a := events.Action{Action: "resolve", By: "alice", At: at}
	b := events.Action{Action: "requeue", By: "bob", At: at.Add(time.Minute)}
	void := events.Action{Action: "requeue", By: "carol", At: at.Add(2 * time.Minute)}
	got := merge([]decision{{seq: 7, a: a}, {seq: 9, a: void}}, []events.Action{a, b})
	if len(got) != 2 || got[0].seq != 7 || got[1].seq != 0 || got[1].a.By != "bob" {
		t.Fatalf("merge = %+v", got)
	}
}

func TestValidateInput(t *testing.T) {
	for _, c := range []struct {
		note, by string
		says     string
	}{
		{"fine", "alice@host", ""},
		{"", "alice", "a note is required"},
		{"   ", "alice", "a note is required"},
		{"n", "", "who acts is required"},
		{"n", "ali\nce", "printable"},
		{strings.Repeat("x", MaxNoteLen+1), "a", "limit 4000"},
		{"n", strings.Repeat("b", MaxByLen+1), "at most 200"},
	} {
		err := validateInput(c.note, c.by)
		if c.says == "" {
			if err != nil {
				t.Errorf("validateInput(%q, %q) = %v", c.note, c.by, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("validateInput(%q, %q) = %v, want %q", textcut.Clip(c.note, 10), textcut.Clip(c.by, 10), err, c.says)
		}
	}
}

func TestFilterValidate(t *testing.T) {
	if err := (Filter{}).Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (Filter{Reason: "gated", Type: "css_fix", Age: time.Hour}).Validate(); err != nil {
		t.Fatal(err)
	}
	err := Filter{Reason: "action", Type: "Bad Type", Age: -1}.Validate()
	for _, want := range []string{`reason "action"`, `task type "Bad Type"`, "negative"} {
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want %q", err, want)
		}
	}
}

func TestRequeueMsgIDIsSalted(t *testing.T) {
	a, b := RequeueMsgID("t", 3, "s1"), RequeueMsgID("t", 3, "s2")
	if a == b || !strings.HasPrefix(a, "t:3:retry:requeue:") {
		t.Fatalf("ids %q, %q", a, b)
	}
}

func TestWhy(t *testing.T) {
	for _, c := range []struct {
		st   events.TaskState
		recs []Record
		tail tail
		want string
	}{
		{events.TaskState{Status: "blocked", Reason: "gave up after 3 attempts", LastError: "still broken"}, nil, tail{},
			"blocked: gave up after 3 attempts; last error: still broken"},
		{events.TaskState{Status: "needs_human_review", Reason: "Blocked: css_fix trust score 0.00 below 0.15"}, nil, tail{},
			"needs_human_review: Blocked: css_fix trust score 0.00 below 0.15"},
		{events.TaskState{Status: "running"}, []Record{{Reason: "poison", Error: "failed 10 deliveries"}, {Reason: "action"}}, tail{Stage: "review.poison"},
			"running: stopped by poison: failed 10 deliveries"},
		{events.TaskState{Status: "pending", Pass: 1}, []Record{{Reason: "poison", Error: "undecodable"}}, tail{Stage: "review.poison", Pass: 1},
			"pending: stopped by poison: undecodable"},
		{events.TaskState{Status: "running", Pass: 3}, []Record{{Reason: "poison", Error: "old"}}, tail{Stage: "review.poison", Pass: 2},
			"running: old"}, // an old pass's record: the task is not stopped by it
		{events.TaskState{Status: "running"}, []Record{{Reason: "poison", Error: "failed 10 deliveries"}}, tail{Stage: "prompted"},
			"running"},
		{events.TaskState{Status: "succeeded", History: []events.AttemptRecord{{Attempt: 1}, {Attempt: 2}}},
			[]Record{{Reason: "escalated", Error: "HANDOFF"}}, tail{Stage: "succeeded"}, "succeeded: on attempt 2"},
		{events.TaskState{Status: "pending"}, nil, tail{}, "pending"},
	} {
		if got := why(c.st, c.recs, c.tail); got != c.want {
			t.Errorf("why = %q, want %q", got, c.want)
		}
	}
}

func TestRetentionString(t *testing.T) {
	r := Retention{Stream: "DISPATCH", MaxAge: 30 * 24 * time.Hour, MaxMsgs: -1, MaxBytes: 1 << 30}
	want := "stream DISPATCH keeps records for 30d, unlimited messages, at most 1073741824 bytes; older ones are removed by JetStream"
	if got := r.String(); got != want {
		t.Errorf("String = %q", got)
	}
}

func TestRepeatedDecisionIsRefused(t *testing.T) {
	at := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	st := events.TaskState{ID: "t-1", Status: events.StatusFailed, Pass: 2, UpdatedAt: at,
		Actions: []events.Action{{Action: events.ActionReject, By: "alice", At: at}}}
	err := checkReviewable(st, tail{Stage: "review.action"}, events.ActionReject)
	if !errors.Is(err, ErrNotReviewable) || !strings.Contains(err.Error(), "reject by alice at 2026-05-18T14:00:00Z already") {
		t.Fatalf("second reject: %v", err)
	}
	// A human may change their mind: requeue or resolve a rejected task.
	for _, a := range []string{events.ActionRequeue, events.ActionResolve} {
		if err := checkReviewable(st, tail{Stage: "review.action"}, a); err != nil {
			t.Errorf("%s after reject: %v", a, err)
		}
	}
	// A pipeline failed the task after the human's reject and a requeue: reject is fine again.
	st.UpdatedAt = at.Add(time.Hour)
	if err := checkReviewable(st, tail{Stage: events.StageExecuted, Pass: 3}, events.ActionReject); err != nil {
		t.Errorf("reject after new activity: %v", err)
	}
}
