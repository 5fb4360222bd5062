package executor

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// TestLedgers runs one suite over both ledgers: the task state in KV and the
// in-memory one used without a TaskStore.
func TestLedgers(t *testing.T) {
	ledgers := map[string]func(t *testing.T) ledger{
		"kv": func(t *testing.T) ledger {
			ns := natstest.Start(t)
			kv, err := ns.JS.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: services.BucketTasks})
			if err != nil {
				t.Fatal(err)
			}
			return kvLedger{tasks: services.NewTaskStore(kv), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		},
		"memory": func(*testing.T) ledger { return &memLedger{} },
	}
	for name, newLedger := range ledgers {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			l := newLedger(t)
			b := events.Base{Task: events.Task{ID: "t1", Type: "css_fix"}, Run: events.Run{Pass: 1, Attempt: 1}}
			other := events.Base{Task: events.Task{ID: "t2", Type: "css_fix"}, Run: events.Run{Pass: 1, Attempt: 1}}

			f, skip, err := l.begin(ctx, b, &known{})
			if err != nil || skip || len(f.failed) != 0 || f.transient != 0 {
				t.Fatalf("begin on a new task = %+v, %v, %v", f, skip, err)
			}
			for want := 1; want <= 3; want++ {
				if n, err := l.cutShort(ctx, b, &known{}, events.Usage{}, nil, true); err != nil || n != want {
					t.Fatalf("cutShort = %d, %v; want %d", n, err, want)
				}
			}
			if f, _, _ := l.begin(ctx, b, &known{}); f.transient != 3 {
				t.Errorf("transient count %d after 3, want 3 (it survives redeliveries)", f.transient)
			}
			// What cut-short tries spent, and the tool loop to resume, are
			// kept until the attempt ends; a tool wait is not a transient.
			resume := &events.Resume{Pass: 1, Turns: []events.Turn{{Role: "assistant", ToolCalls: []events.ToolCall{{ID: "c1", Name: "x", Arguments: "{}"}}}},
				Pending: []events.ToolCall{{ID: "c1", Name: "x", Arguments: "{}"}}, ToolWaits: 1}
			if n, err := l.cutShort(ctx, b, &known{}, events.Usage{TokensIn: 100, TokensOut: 20, Cost: 0.5}, resume, false); err != nil || n != 3 {
				t.Fatalf("cutShort of a tool wait = %d, %v; want the count unchanged, 3", n, err)
			}
			f, _, _ = l.begin(ctx, b, &known{})
			if f.unbilled != (events.Usage{TokensIn: 100, TokensOut: 20, Cost: 0.5}) || f.resume == nil || len(f.resume.Pending) != 1 || f.resume.ToolWaits != 1 {
				t.Errorf("unbilled %+v resume %+v, want what the cut-short try spent and its loop", f.unbilled, f.resume)
			}
			if f, _, _ := l.begin(ctx, other, &known{}); f.resume != nil {
				t.Errorf("another task resumes %+v", f.resume)
			}
			if err := l.settle(ctx, b, &known{}); err != nil {
				t.Fatal(err)
			}
			// In the task's state the unbilled spend stays until the
			// recorder records the Result that bills it; in memory no
			// recorder reaches it: settle bills it.
			wantUnbilled := events.Usage{TokensIn: 100, TokensOut: 20, Cost: 0.5}
			if name == "memory" {
				wantUnbilled = events.Usage{}
			}
			if f, _, _ := l.begin(ctx, b, &known{}); f.unbilled != wantUnbilled || f.transient != 0 || f.resume != nil {
				t.Errorf("after settle: %+v", f)
			}
			if n, _ := l.cutShort(ctx, b, &known{}, events.Usage{}, nil, true); n != 1 {
				t.Errorf("count after settle then a failure: %d, want 1", n)
			}

			for range 2 { // idempotent
				if err := l.addFailed(ctx, b, &known{}, "h1", events.ErrorClassDeterministic, "boom"); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.addFailed(ctx, b, &known{}, "tool:h2", events.ErrorClassDeterministic, ""); err != nil {
				t.Fatal(err)
			}
			if counted, err := l.addRefused(ctx, b, &known{}); err != nil || !counted {
				t.Fatalf("refusal counted %v, %v", counted, err)
			}
			if counted, err := l.addRefused(ctx, b, &known{}); err != nil || counted {
				t.Fatalf("the same pass's refusal again counted %v, %v; want once", counted, err)
			}
			f, _, _ = l.begin(ctx, b, &known{})
			if len(f.failed) != 0 || len(f.bannedNow) != 2 || f.bannedNow["h1"] != events.ErrorClassDeterministic || f.bannedNow["tool:h2"] != events.ErrorClassDeterministic {
				t.Errorf("the same pass sees failed %v, banned now %v; want its own bans, its tool call among them, listed apart",
					f.failed, f.bannedNow)
			}
			later := b
			later.Run.Pass++
			f, _, _ = l.begin(ctx, later, &known{})
			if len(f.failed) != 2 || !f.failed["h1"] || !f.failed["tool:h2"] || len(f.bannedNow) != 0 {
				t.Errorf("failed %v, want h1 and tool:h2 once each", f.failed)
			}
			if f, _, _ := l.begin(ctx, other, &known{}); len(f.failed) != 0 || f.transient != 0 {
				t.Errorf("another task sees %+v, want nothing", f)
			}

			// a loop kept for one pass is never resumed by another
			kept := *resume
			kept.Pass = later.Run.Pass
			if _, err := l.cutShort(ctx, later, &known{}, events.Usage{}, &kept, false); err != nil {
				t.Fatal(err)
			}
			if f, _, _ := l.begin(ctx, later, &known{}); f.resume == nil {
				t.Error("the redelivered pass 2 does not resume its loop")
			}
			third := later
			third.Run.Pass++
			if f, _, _ := l.begin(ctx, third, &known{}); f.resume != nil {
				t.Errorf("pass 3 resumes the loop of pass 2: %+v", f.resume)
			}
		})
	}
}

func TestKVLedgerState(t *testing.T) {
	ctx := context.Background()
	ns := natstest.Start(t)
	kv, err := ns.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: services.BucketTasks})
	if err != nil {
		t.Fatal(err)
	}
	tasks := services.NewTaskStore(kv)
	l := kvLedger{tasks: tasks, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	b := events.Base{Task: events.Task{ID: "t1", Type: "css_fix"}, Run: events.Run{Pass: 2, Attempt: 2}}
	if _, _, err := l.begin(ctx, b, &known{}); err != nil {
		t.Fatal(err)
	}
	_, _ = l.cutShort(ctx, b, &known{}, events.Usage{}, nil, true)
	_ = l.addFailed(ctx, b, &known{}, "h1", events.ErrorClassDeterministic, "boom")
	_, _ = l.addRefused(ctx, b, &known{})
	_, _ = l.addRefused(ctx, b, &known{}) // the same pass delivered again: counted once
	st, err := tasks.Get(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != events.StatusRunning || st.TransientRetries != 1 || st.Refused != 1 || st.RefusedPass != 2 || len(st.FailedRequests) != 1 || st.FailedRequests[0] != "h1@2" {
		t.Errorf("state %+v, want running with 1 transient retry, 1 refusal (pass 2) and h1 banned", st)
	}

	// a later pass or an ended task is skipped
	later := b
	later.Run.Pass = 1
	if _, skip, _ := l.begin(ctx, later, &known{}); !skip {
		t.Error("an older pass was not skipped")
	}
}

// An attempt reads the task's state once, in begin: each later write
// starts from the one before, and what it knows last — what its Executed
// event carries to the recorder — is what the bucket holds. A write of
// someone else in between (a human's cancel) makes it read again.
func TestKVLedgerWritesFromWhatItKnows(t *testing.T) {
	ctx := context.Background()
	ns := natstest.Start(t)
	bucket, err := ns.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: services.BucketTasks})
	if err != nil {
		t.Fatal(err)
	}
	kv := &natstest.CountReads{KeyValue: bucket}
	tasks := services.NewTaskStore(kv)
	l := kvLedger{tasks: tasks, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, stale := range []bool{false, true} {
		id := map[bool]string{false: "current", true: "stale"}[stale]
		tk := events.Task{ID: id, Type: "css_fix", Subject: "a.css"}
		if _, _, err := tasks.Create(ctx, task.New(tk)); err != nil {
			t.Fatal(err)
		}
		b := events.Base{Task: tk, Run: events.Run{Pass: 1, Attempt: 1}}
		k := &known{}
		if _, skip, err := l.begin(ctx, b, k); err != nil || skip {
			t.Fatalf("%s: begin: skip %v, %v", id, skip, err)
		}
		if stale { // a write the attempt does not know of
			if _, _, err := tasks.Apply(ctx, id, func(st events.TaskState, _ bool) (events.TaskState, task.Cause) {
				st.Reason = "touched"
				return st, task.CauseApplied
			}); err != nil {
				t.Fatal(err)
			}
		}
		kv.Reset()
		if err := l.addFailed(ctx, b, k, "h1", events.ErrorClassDeterministic, "boom"); err != nil {
			t.Fatal(err)
		}
		if _, err := l.addRefused(ctx, b, k); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{false: 0, true: 1}[stale]; kv.Reads() != want {
			t.Errorf("%s: %d reads, want %d", id, kv.Reads(), want)
		}
		e, err := bucket.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		last := k.state()
		if last == nil || last.Rev != e.Revision() || last.State.Status != events.StatusRunning || len(last.State.FailedRequests) != 1 || last.State.Refused != 1 {
			t.Fatalf("%s: the attempt knows %+v, the bucket holds revision %d", id, last, e.Revision())
		}
		if stale && last.State.Reason != "touched" {
			t.Errorf("stale: the write in between was lost: %+v", last.State)
		}
	}
}
