package review_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/openaitest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

var bg = context.Background()

// escalate submits a task that fails its only attempt and waits for its
// escalation record.
func escalate(m *reviewtest.Mesh, id, taskType string) {
	m.Submit(events.Submit{ID: id, Type: taskType, Subject: id + ".go", MaxRetries: 1, Payload: json.RawMessage(`{"issue":"broken"}`)})
	m.WaitStage(id, "review.escalated", 1)
}

func actionRecords(t *testing.T, m *reviewtest.Mesh, id string) []events.Action {
	t.Helper()
	var out []events.Action
	for _, e := range m.Events(id) {
		if e.Stage == "review.action" {
			var a events.Action
			if err := json.Unmarshal(e.Data, &a); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(e.By, "human:") {
				t.Errorf("action record by %q, want human:<who>", e.By)
			}
			out = append(out, a)
		}
	}
	return out
}

func TestResolveEndToEnd(t *testing.T) {
	m := reviewtest.Start(t, reviewtest.FailUnless("never"), reviewtest.Options{})
	escalate(m, "res-1", "bug_fix")

	d, err := m.Review.Resolve(bg, "res-1", "fixed it by hand in a1b2c3", "alice@laptop")
	if err != nil {
		t.Fatal(err)
	}
	st := m.State("res-1")
	if st.Status != events.StatusSucceeded || d.Task.Status != events.StatusSucceeded {
		t.Fatalf("status = %s, want succeeded", st.Status)
	}
	if len(st.Actions) != 1 || st.Actions[0].Action != events.ActionResolve || st.Actions[0].By != "alice@laptop" ||
		st.Actions[0].Note != "fixed it by hand in a1b2c3" {
		t.Fatalf("actions = %+v", st.Actions)
	}
	if !strings.Contains(st.Reason, "resolved by alice@laptop") {
		t.Errorf("reason = %q", st.Reason)
	}
	if got := actionRecords(t, m, "res-1"); len(got) != 1 || got[0].Action != events.ActionResolve {
		t.Fatalf("action records = %+v", got)
	}

	// The item leaves the queue, and -all shows who handled it.
	q, err := m.Review.List(bg, review.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Items) != 0 || q.Scanned != 2 || q.Next != "" { // the record and the decision
		t.Fatalf("open items = %+v, read %d messages, next %q", q.Items, q.Scanned, q.Next)
	}
	if open, err := m.Review.OpenCounts(bg); err != nil || open[events.ReviewEscalated] != 0 {
		t.Fatalf("open counts = %v, %v", open, err)
	}
	q, err = m.Review.List(bg, review.Filter{All: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Items) != 1 || q.Items[0].Handled == nil || q.Items[0].Handled.By != "alice@laptop" || q.Items[0].Status != events.StatusSucceeded {
		t.Fatalf("all items = %+v", q.Items)
	}

	// Acting twice is refused: the task is no longer waiting.
	if _, err := m.Review.Resolve(bg, "res-1", "again", "bob"); !errors.Is(err, review.ErrNotReviewable) {
		t.Fatalf("second resolve: %v, want ErrNotReviewable", err)
	}
}

func TestRejectEndToEnd(t *testing.T) {
	m := reviewtest.Start(t, reviewtest.FailUnless("never"), reviewtest.Options{})
	escalate(m, "rej-1", "bug_fix")
	if _, err := m.Review.Reject(bg, "rej-1", "the feature is being removed", "alice"); err != nil {
		t.Fatal(err)
	}
	st := m.State("rej-1")
	if st.Status != events.StatusFailed || len(st.Actions) != 1 || st.Actions[0].Action != events.ActionReject {
		t.Fatalf("state = %s %+v", st.Status, st.Actions)
	}
	if got := actionRecords(t, m, "rej-1"); len(got) != 1 || got[0].Note != "the feature is being removed" {
		t.Fatalf("action records = %+v", got)
	}
	if n := m.Model.Calls(); n != 1 {
		t.Fatalf("a rejected task reached the model again: %d calls", n)
	}
}

func TestRequeueEndToEnd(t *testing.T) {
	const note = "the null comes from parsePayload(), not handleResponse()"
	m := reviewtest.Start(t, reviewtest.FailUnless(note), reviewtest.Options{})
	escalate(m, "rq-1", "bug_fix")
	before := m.State("rq-1")

	d, err := m.Review.Requeue(bg, "rq-1", note, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if d.Task.Status != events.StatusPending || d.Task.Pass != before.Pass+1 || d.Task.RoundStart != before.Attempts {
		t.Fatalf("state after requeue = %+v", d.Task)
	}
	all := m.WaitStage("rq-1", events.StageSucceeded, 1)
	if !strings.Contains(m.LastPrompt(), note) {
		t.Fatalf("the note is not in the prompt:\n%s", m.LastPrompt())
	}
	st := m.State("rq-1")
	if st.Status != events.StatusSucceeded || st.Attempts != 2 || len(st.Actions) != 1 {
		t.Fatalf("state = %s, %d attempts, %d actions", st.Status, st.Attempts, len(st.Actions))
	}

	// The retry event carries the note, the reviewed flag, the dead ends and the last error.
	var retry events.Retry
	for _, e := range all {
		if e.Stage == events.StageRetry {
			if err := json.Unmarshal(e.Data, &retry); err != nil {
				t.Fatal(err)
			}
		}
	}
	r := retry.Run
	if r.Note != note || !r.Reviewed || r.Pass != before.Pass+1 || r.Attempt != before.Attempts+1 ||
		r.Rung != events.RungRefine || r.Context != before.LastError || retry.Reason != "requeued by alice: "+note {
		t.Fatalf("retry = %+v reason %q", r, retry.Reason)
	}
	want := []string{"retry", "verified", "admitted", "prompted", "executed", "succeeded"}
	if got := stagesAfter(all, "review.escalated"); !slices.Equal(got, want) {
		t.Errorf("stages after the escalation = %v, want %v", got, want)
	}
	if got := actionRecords(t, m, "rq-1"); len(got) != 1 || got[0].Action != events.ActionRequeue || got[0].Note != note {
		t.Errorf("action records = %+v", got)
	}

	// Timeline reads exactly what timeline.Follow reads.
	var followed []timeline.Entry
	if err := timeline.Follow(bg, m.Srv.JS, "rq-1", false, func(e timeline.Entry) bool { followed = append(followed, e); return true }); err != nil {
		t.Fatal(err)
	}
	mine := m.Events("rq-1")
	if len(mine) != len(followed) {
		t.Fatalf("Timeline has %d entries, timeline.Follow %d", len(mine), len(followed))
	}
	for i := range mine {
		a, b := mine[i], followed[i]
		if a.Seq != b.Seq || !a.Time.Equal(b.Time) || a.Subject != b.Subject || a.Event != b.Event || a.Stage != b.Stage ||
			a.By != b.By || a.Error != b.Error || string(a.Data) != string(b.Data) {
			t.Errorf("entry %d: %+v\nFollow: %+v", i, a, b)
		}
	}
}

// stagesAfter lists the stages after the first entry of stage, without
// review.action entries: the action record is published after the retry,
// so where it lands among the next stages is a race.
func stagesAfter(all []timeline.Entry, stage string) []string {
	i := slices.IndexFunc(all, func(e timeline.Entry) bool { return e.Stage == stage })
	if i < 0 {
		return nil
	}
	var out []string
	for _, s := range timeline.Stages(all[i+1:]) {
		if s != "review.action" {
			out = append(out, s)
		}
	}
	return out
}

func waitABit(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(20 * time.Millisecond):
	}
}

// A requeue must never be swallowed by deduplication, even while the task's
// earlier Msg-Ids — and the id an unsalted retry of the new pass would have
// — are inside the stream's duplicate window. Two requeues in a row.
func TestRequeueInsideDedupWindow(t *testing.T) {
	m := reviewtest.Start(t, reviewtest.FailUnless("second note"), reviewtest.Options{})
	escalate(m, "dd-1", "bug_fix")
	st := m.State("dd-1")

	// Occupy the deterministic id of the next pass's retry, as a retry of
	// that pass published earlier would have.
	taken := services.MsgID("dd-1", st.Pass+1, events.StageRetry)
	if _, err := m.Srv.JS.Publish(bg, events.TaskSubject("dd-1", "dedup-probe"), []byte(`{}`), jetstream.WithMsgID(taken)); err != nil {
		t.Fatal(err)
	}
	ack, err := m.Srv.JS.Publish(bg, events.TaskSubject("dd-1", "dedup-probe"), []byte(`{}`), jetstream.WithMsgID(taken))
	if err != nil || !ack.Duplicate {
		t.Fatalf("the probe id is not inside the duplicate window (dup=%v, err=%v)", ack != nil && ack.Duplicate, err)
	}

	if _, err := m.Review.Requeue(bg, "dd-1", "first note", "alice"); err != nil {
		t.Fatal(err)
	}
	m.WaitStage("dd-1", "review.escalated", 2) // fails again: the note is not the one the model wants
	if _, err := m.Review.Requeue(bg, "dd-1", "second note", "alice"); err != nil {
		t.Fatal(err)
	}
	all := m.WaitStage("dd-1", events.StageSucceeded, 1)
	if got := timeline.Count(all, events.StageRetry); got != 2 {
		t.Fatalf("%d retry events stored, want 2 (one per requeue): %v", got, timeline.Stages(all))
	}
	if got := m.State("dd-1"); got.Status != events.StatusSucceeded || len(got.Actions) != 2 || got.Pass != st.Pass+2 {
		t.Fatalf("state = %s pass %d, %d actions", got.Status, got.Pass, len(got.Actions))
	}
	if m.Model.Calls() != 3 {
		t.Fatalf("model calls = %d, want 3", m.Model.Calls())
	}
}

func TestActionsRefusedWhileTheTaskRuns(t *testing.T) {
	m := reviewtest.Start(t, reviewtest.FailUnless("never"), reviewtest.Options{})
	m.Model.Started = make(chan openaitest.Request, 1)
	m.Model.Block = make(chan struct{})
	m.Submit(events.Submit{ID: "busy-1", Type: "bug_fix", Subject: "a.go", MaxRetries: 1})
	<-m.Model.Started // the executor is mid call: the task is running

	for _, act := range []func(context.Context, string, string, string) (review.Decision, error){
		m.Review.Requeue, m.Review.Resolve, m.Review.Reject,
	} {
		_, err := act(bg, "busy-1", "a note", "alice")
		if !errors.Is(err, review.ErrNotReviewable) || !strings.Contains(err.Error(), "running") {
			t.Fatalf("acting on a running task: %v", err)
		}
	}
	close(m.Model.Block)
	m.WaitStage("busy-1", "review.escalated", 1)
	if st := m.State("busy-1"); len(st.Actions) != 0 {
		t.Fatalf("refused actions were recorded: %+v", st.Actions)
	}
}

func TestRejectedInputCanBeDismissedNotRequeued(t *testing.T) {
	m := reviewtest.Start(t, reviewtest.FailUnless("never"), reviewtest.Options{})
	m.SubmitRaw("css_fix", []byte(`{"id":"bad-1","subject":"a.css","max_retries":"three"}`))
	q := waitItems(t, m, review.Filter{Reason: events.ReviewRejected}, 1)
	it := q.Items[0]
	if it.Key != "bad-1" || it.TaskID != "" || it.Type != "css_fix" || !strings.Contains(it.Error, "max_retries") {
		t.Fatalf("rejected item = %+v", it)
	}
	if _, err := m.Review.Requeue(bg, "bad-1", "try again", "alice"); !errors.Is(err, review.ErrNoTask) {
		t.Fatalf("requeue of rejected input: %v, want ErrNoTask", err)
	}
	if _, err := m.Review.Reject(bg, "bad-1", "client bug, reported to team web", "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Review.Resolve(bg, "bad-1", "changed my mind", "bob"); !errors.Is(err, review.ErrNotReviewable) {
		t.Fatalf("second decision on a handled record: %v", err)
	}
	q, err := m.Review.List(bg, review.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Items) != 0 {
		t.Fatalf("after reject: items %+v", q.Items)
	}
	if open, err := m.Review.OpenCounts(bg); err != nil || open[events.ReviewRejected] != 0 {
		t.Fatalf("after reject: open counts %v, %v", open, err)
	}
	if _, err := m.Review.Resolve(bg, "no-such-id", "x", "alice"); !errors.Is(err, review.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
}

func waitItems(t *testing.T, m *reviewtest.Mesh, f review.Filter, n int) review.Queue {
	t.Helper()
	ctx, cancel := context.WithTimeout(bg, reviewtest.Patience)
	defer cancel()
	for {
		q, err := m.Review.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(q.Items) >= n {
			return q
		}
		if ctx.Err() != nil {
			t.Fatalf("want %d items, have %+v", n, q.Items)
		}
		waitABit(ctx)
	}
}

func TestBulkRequeueByTypeAndReason(t *testing.T) {
	const note = "retry with the new API key"
	m := reviewtest.Start(t, reviewtest.FailUnless(note), reviewtest.Options{})
	for _, id := range []string{"b-a1", "b-a2", "b-a3"} {
		escalate(m, id, "css_fix")
	}
	escalate(m, "b-b1", "sql_fix")

	if _, err := m.Review.RequeueWhere(bg, "", "", note, "alice"); !errors.Is(err, review.ErrInvalid) {
		t.Fatalf("bulk requeue without a filter: %v", err)
	}
	res, err := m.Review.RequeueWhere(bg, "css_fix", events.ReviewEscalated, note, "alice")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(res.Requeued)
	if !slices.Equal(res.Requeued, []string{"b-a1", "b-a2", "b-a3"}) || len(res.Skipped) != 0 {
		t.Fatalf("bulk result = %+v", res)
	}
	for _, id := range res.Requeued {
		m.WaitStage(id, events.StageSucceeded, 1)
	}
	if st := m.State("b-b1"); st.Status != events.StatusBlocked || len(st.Actions) != 0 {
		t.Fatalf("the other type was touched: %s %+v", st.Status, st.Actions)
	}
	q, err := m.Review.List(bg, review.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Items) != 1 || q.Items[0].Key != "b-b1" {
		t.Fatalf("open items = %+v", q.Items)
	}
	// Again: nothing of that type is open any more.
	res, err = m.Review.RequeueWhere(bg, "css_fix", "", note, "alice")
	if err != nil || len(res.Requeued) != 0 {
		t.Fatalf("second bulk requeue = %+v, %v", res, err)
	}
}

// Needs the lead's gate change: the gate admits a task whose Run.Reviewed is
// set, and the recorder carries Reviewed through the round's retries.
func TestRequeueOfHeldTask(t *testing.T) {
	const note = "checked the selector by hand, go ahead"
	m := reviewtest.Start(t, reviewtest.FailUnless(note), reviewtest.Options{Scoring: trust.Policy{MinOutcomes: 1}})
	escalate(m, "warm-1", "css_fix") // one failure: css_fix now scores 0 over 1 outcome
	m.Submit(events.Submit{ID: "g-1", Type: "css_fix", Subject: "a.css", MaxRetries: 3})
	// Held for trust: a human may act at once. Until warm-1's canary claim
	// is released the pass may first wait for it (a canary hold, status
	// still pending); the gate's next look holds it for trust.
	ctx, cancel := context.WithTimeout(bg, reviewtest.Patience)
	defer cancel()
	for {
		st, err := m.Tasks.Get(ctx, "g-1") // not found until intake has written it
		if err == nil && st.Status == events.StatusHeld {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("g-1 not held: %+v, %v; events %v", st, err, timeline.Stages(m.Events("g-1")))
		}
		waitABit(ctx)
	}
	if _, err := m.Review.Requeue(bg, "g-1", note, "alice"); err != nil {
		t.Fatal(err)
	}
	all := m.WaitStage("g-1", events.StageSucceeded, 1)
	t.Logf("stages: %v", timeline.Stages(all))
	trustHolds := 0
	for _, e := range all {
		var h events.Held
		if e.Stage == events.StageHeld && json.Unmarshal(e.Data, &h) == nil && h.Hold == events.HoldTrust {
			trustHolds++
		}
	}
	if trustHolds != 1 {
		t.Fatalf("held for trust %d times: %v", trustHolds, timeline.Stages(all))
	}
}

// Two reviewers look at the same blocked task. Alice rejects it; Bob, on
// the page he opened before, requeues it: his decision is refused, naming
// hers, instead of silently overturning it. Sent again having seen it (or
// without saying what he saw, as the CLI does), it goes.
func TestADecisionTakenMeanwhileIsNotOverturnedBlind(t *testing.T) {
	m := reviewtest.Start(t, reviewtest.FailUnless("never"), reviewtest.Options{})
	escalate(m, "cf-1", "bug_fix")
	if _, err := m.Review.DecideSeen(bg, events.ActionReject, "cf-1", "feature removed, do not ship", "alice", 0); err != nil {
		t.Fatal(err)
	}
	_, err := m.Review.DecideSeen(bg, events.ActionRequeue, "cf-1", "try again", "bob", 0)
	var decided *review.DecidedError
	if !errors.As(err, &decided) || !errors.Is(err, review.ErrNotReviewable) || decided.Latest.By != "alice" ||
		!strings.Contains(err.Error(), "alice decided reject") {
		t.Fatalf("bob's blind requeue: %v, want it refused naming alice's reject", err)
	}
	if st := m.State("cf-1"); st.Status != events.StatusFailed || len(st.Actions) != 1 {
		t.Fatalf("state %s with %d decisions, want alice's reject only", st.Status, len(st.Actions))
	}
	if d, err := m.Review.DecideSeen(bg, events.ActionRequeue, "cf-1", "seen it: try again", "bob", 1); err != nil || d.Task.Status != events.StatusPending {
		t.Fatalf("bob's requeue having seen it: %+v, %v", d, err)
	}
}
