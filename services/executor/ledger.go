package executor

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// facts is what the executor needs to know of a task before it calls anything.
type facts struct {
	// failed holds the hashes of requests (and "tool:" calls) that failed
	// deterministically.
	failed map[string]bool
	// bannedNow holds the hashes this very pass banned, with the class they
	// failed with: a redelivery whose first delivery's Executed was never
	// stored fails again with it instead of sending the request (redelivered).
	bannedNow map[string]events.ErrorClass
	// redelivered is set on a redelivery whose pass has no Executed stored.
	redelivered bool
	// transient counts the transient failures of the current attempt.
	transient int
	// lastError is the previous failure's error (TaskState.LastError).
	lastError string
	// unbilled is what cut-short tries of this attempt spent.
	unbilled events.Usage
	// resume is this pass's tool loop as a cut-short try left it, or nil.
	resume *events.Resume
}

// ledger keeps the per-task facts of the error discipline: in the task's
// state in KV (TaskState.FailedRequests, Refused, TransientRetries) so they
// survive redeliveries and instances, or in memory when no TaskStore is
// configured. Every write is a compare-and-set.
type ledger interface {
	// begin reads the facts and marks the task running for this pass; skip
	// is true when the task has moved on (a later pass, or ended).
	begin(ctx context.Context, b events.Base, k *known) (f facts, skip bool, err error)
	// cutShort keeps what a try cut short leaves for the attempt's next
	// try: what its calls spent (unbilled until the attempt's Result) and
	// its tool loop to resume (nil: none). transient counts the failure
	// against the attempt's transient budget; the attempt's count is returned.
	cutShort(ctx context.Context, b events.Base, k *known, spent events.Usage, resume *events.Resume, transient bool) (int, error)
	// settle resets the attempt's transient count and tool loop once the
	// attempt is over (task.Settle: its unbilled spend stays until its
	// Result is recorded).
	settle(ctx context.Context, b events.Base, k *known) error
	// addFailed records a hash that failed deterministically, with its
	// class (idempotent).
	addFailed(ctx context.Context, b events.Base, k *known, hash string, class events.ErrorClass, errText string) error
	// addRefused counts a refused request, once per pass; counted is false
	// when this pass's refusal was counted already (a redelivery).
	addRefused(ctx context.Context, b events.Base, k *known) (counted bool, err error)
}

// known is the task's state as an attempt last read or wrote it, with its
// revision (events.StateAt; nil: not known): each of the attempt's writes
// tries its compare-and-set from it instead of reading the state first, and
// the Executed event carries it to the recorder. Writes of one attempt may
// come from concurrent tool calls: mu orders them.
type known struct {
	mu sync.Mutex
	at *events.StateAt
}

// state is the attempt's last known state, for its Executed event.
func (k *known) state() *events.StateAt {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.at
}

// kvLedger keeps the facts in the task's state.
type kvLedger struct {
	tasks *services.TaskStore
	log   *slog.Logger
}

func (l kvLedger) begin(ctx context.Context, b events.Base, k *known) (facts, bool, error) {
	var f facts
	// One compare-and-set reads the facts and marks the task running.
	_, cause, err := l.apply(ctx, b, k, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		next, c := task.Begin(st, found, b)
		f = facts{}
		if c == task.CauseApplied || c == task.CauseRedelivered {
			f = facts{failed: bannedBefore(next.FailedRequests, b.Run.Pass), bannedNow: bannedIn(next.FailedRequests, b.Run.Pass),
				transient: next.TransientRetries, lastError: next.LastError, unbilled: next.Unbilled, resume: next.Resume}
		}
		return next, c
	})
	if err != nil {
		return facts{}, false, err
	}
	skip := cause == task.CauseMovedOn || cause == task.CauseEnded
	if skip {
		l.log.Info("prompt skipped: the task has moved on", "task", b.Task.ID, "pass", b.Run.Pass)
	}
	return f, skip, nil
}

// apply runs one of the task's attempt transitions on its stored state,
// from the state as the attempt last knew it (k.at; nil: read it).
func (l kvLedger) apply(ctx context.Context, b events.Base, k *known, tr func(st events.TaskState, found bool) (events.TaskState, task.Cause)) (events.TaskState, task.Cause, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	at, c, err := l.tasks.ApplyAt(ctx, b.Task.ID, k.at, tr)
	if err != nil {
		k.at = nil
		return at.State, c, storeErr(ctx, err)
	}
	k.at = &at
	if at.Rev == 0 { // no state stored (the key is gone): nothing to carry
		k.at = nil
	}
	return at.State, c, nil
}

func (l kvLedger) cutShort(ctx context.Context, b events.Base, k *known, spent events.Usage, resume *events.Resume, transient bool) (int, error) {
	st, _, err := l.apply(ctx, b, k, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.CutShort(st, found, b, spent, resume, transient)
	})
	return st.TransientRetries, err
}

func (l kvLedger) settle(ctx context.Context, b events.Base, k *known) error {
	_, _, err := l.apply(ctx, b, k, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.Settle(st, found, b)
	})
	return err
}

func (l kvLedger) addFailed(ctx context.Context, b events.Base, k *known, hash string, class events.ErrorClass, _ string) error {
	_, _, err := l.apply(ctx, b, k, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.AddFailed(st, found, b, hash, class)
	})
	return err
}

func (l kvLedger) addRefused(ctx context.Context, b events.Base, k *known) (bool, error) {
	_, c, err := l.apply(ctx, b, k, func(st events.TaskState, found bool) (events.TaskState, task.Cause) {
		return task.AddRefused(st, found, b)
	})
	return c == task.CauseApplied, err
}

func storeErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("executor: task state: %w", err)
}

// bannedIn is the hashes that failed in pass itself, with their class.
func bannedIn(entries []string, pass int) map[string]events.ErrorClass {
	m := map[string]events.ErrorClass{}
	for _, e := range entries {
		if hash, n, class := task.ParseFailedEntry(e); n == pass {
			m[hash] = class
		}
	}
	return m
}

// bannedBefore is the set of hashes that failed in a pass before pass (or
// in no pass the entry names).
func bannedBefore(entries []string, pass int) map[string]bool {
	m := make(map[string]bool, len(entries))
	for _, e := range entries {
		if hash, n, _ := task.ParseFailedEntry(e); n < pass {
			m[hash] = true
		}
	}
	return m
}

// memLedger keeps the facts in this instance's memory (no TaskStore): they
// survive redeliveries to this instance only, and grow with the tasks seen.
type memLedger struct {
	mu    sync.Mutex
	tasks map[string]*memTask
}

type memTask struct {
	failed    []string
	transient int
	refused   events.TaskState // Refused and RefusedPass, as task.AddRefused keeps them
	lastError string
	unbilled  events.Usage
	resume    *events.Resume
}

func (l *memLedger) task(id string) *memTask {
	if l.tasks == nil {
		l.tasks = map[string]*memTask{}
	}
	t, ok := l.tasks[id]
	if !ok {
		t = &memTask{}
		l.tasks[id] = t
	}
	return t
}

func (l *memLedger) begin(_ context.Context, b events.Base, _ *known) (facts, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.task(b.Task.ID)
	f := facts{failed: bannedBefore(t.failed, b.Run.Pass), bannedNow: bannedIn(t.failed, b.Run.Pass), transient: t.transient,
		lastError: t.lastError, unbilled: t.unbilled}
	if t.resume != nil && t.resume.Pass == b.Run.Pass {
		f.resume = t.resume
	}
	return f, false, nil
}

func (l *memLedger) cutShort(_ context.Context, b events.Base, _ *known, spent events.Usage, resume *events.Resume, transient bool) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.task(b.Task.ID)
	if transient {
		t.transient++
	}
	t.unbilled = t.unbilled.Add(spent)
	t.resume = resume
	return t.transient, nil
}

// settle also bills the unbilled spend here: no recorder reaches this
// ledger's memory to do it when the Result is recorded.
func (l *memLedger) settle(_ context.Context, b events.Base, _ *known) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.task(b.Task.ID)
	t.transient, t.unbilled, t.resume = 0, events.Usage{}, nil
	return nil
}

func (l *memLedger) addFailed(_ context.Context, b events.Base, _ *known, hash string, class events.ErrorClass, errText string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.task(b.Task.ID)
	st, _ := task.AddFailed(events.TaskState{FailedRequests: t.failed}, true, b, hash, class)
	t.failed = st.FailedRequests
	if errText != "" {
		t.lastError = errText // what the recorder keeps as TaskState.LastError
	}
	return nil
}

func (l *memLedger) addRefused(_ context.Context, b events.Base, _ *known) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.task(b.Task.ID)
	var c task.Cause
	t.refused, c = task.AddRefused(t.refused, true, b)
	return c == task.CauseApplied, nil
}
