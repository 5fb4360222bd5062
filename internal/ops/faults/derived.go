package faults

// The stores derived from the attempts (the outcome stream, the spend
// counters, everything dispatch rebuild recomputes) held to what the
// recorded attempts imply.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/rebuild"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// trust checks each type's outcomes on the outcome stream and its daily
// spend against what the recorded attempts of its tasks imply. The stream
// keeps the last trust.Keep outcomes of a type it received: every one it
// keeps is a recorded attempt that counts for trust, stored once, with its
// outcome and date. Which ones it keeps: all of them while the type has no
// more than Keep; beyond that, the newest trust.MaxWindow by (At, Key) —
// every window a policy may score — are exactly the newest recorded (the
// older ones depend on the order concurrent recorders' outcomes arrived in:
// see rebuild.OutcomeDepth). The spend counters of every (type, day) are
// the sum of the recorded attempts' tokens and cost — the figures a
// recorder killed before its ack must not count twice.
func (c *checker) trust(ctx context.Context, windows map[string][]trust.Outcome, stored map[string]map[string]int) error {
	recorded, implied, total, want := c.impliedByAttempts()
	drift := func(format string, args ...any) {
		c.r.CounterDrift++
		c.problem("", KindDrift, format, args...)
	}
	has := func(outcomes []trust.Outcome, key string) bool {
		return slices.ContainsFunc(outcomes, func(o trust.Outcome) bool { return o.Key == key })
	}
	for _, typ := range slices.Sorted(maps.Keys(union(windows, implied))) {
		kept := windows[typ]
		for _, o := range kept {
			r, ok := recorded[o.Key]
			switch {
			case !ok:
				drift("type %s: outcome %s on the outcome stream is no recorded attempt that counts for trust", typ, o.Key)
			case r.Success != o.Success || !r.At.Equal(o.At):
				drift("type %s: outcome %s is success=%v at %s on the outcome stream; recorded success=%v at %s",
					typ, o.Key, o.Success, o.At.Format(time.RFC3339Nano), r.Success, r.At.Format(time.RFC3339Nano))
			}
		}
		depth := trust.MaxWindow
		if total[typ] <= trust.Keep {
			depth = trust.Keep // the stream had nothing to let go
		}
		newest, keptNewest := lastN(implied[typ], depth), lastN(kept, depth)
		for _, o := range keptNewest {
			if _, ok := recorded[o.Key]; ok && !has(newest, o.Key) {
				drift("type %s: outcome %s is one of the newest %d on the outcome stream, not of the newest %d recorded", typ, o.Key, depth, depth)
			}
		}
		for _, o := range newest {
			if !has(keptNewest, o.Key) {
				drift("type %s: outcome %s, one of the newest %d recorded, is not among the newest %d on the outcome stream", typ, o.Key, depth, depth)
			}
		}
	}
	for _, subject := range slices.Sorted(maps.Keys(stored)) {
		for _, key := range slices.Sorted(maps.Keys(stored[subject])) {
			switch n := stored[subject][key]; {
			case key == "":
				drift("%d messages on %s are no outcome (no key): the gate leaves them out", n, subject)
			case n > 1:
				drift("outcome %s stored %d times on %s", key, n, subject)
			}
		}
	}
	return c.spendDrift(ctx, want)
}

// impliedByAttempts is what the recorded attempts of the tasks imply for
// trust and spend: each outcome that counts for trust (the gate's end
// markers too), each type's newest trust.Keep of them and how many there
// are, and what each (type, day) spent under a daily budget.
func (c *checker) impliedByAttempts() (recorded map[string]trust.Outcome, implied map[string][]trust.Outcome, total map[string]int, want map[[2]string]trust.DaySpend) {
	recorded = map[string]trust.Outcome{}  // by key, of attempts that count for trust
	implied = map[string][]trust.Outcome{} // by type: the newest Keep of them
	total = map[string]int{}               // by type: how many
	want = map[[2]string]trust.DaySpend{}
	for _, id := range slices.Sorted(maps.Keys(c.states)) {
		st := c.states[id]
		// The gate's handoff before an attempt, and its stop of a retry,
		// mark the task ended on its type's outcomes (trust.EndMarker),
		// dated by the gate's decision.
		if te := c.v.tasks[id]; te != nil {
			for _, e := range te.endings {
				if (e.Kind == EndEscalated && e.Cause == events.CauseRungRate) || (e.Kind == EndGated && e.Attempt > 1) {
					o := trust.EndMarker(id, e.Pass, e.At)
					recorded[o.Key] = o
					implied[st.Type], _ = trust.Insert(implied[st.Type], o, trust.Keep)
					total[st.Type]++
				}
			}
		}
		for _, rec := range st.History {
			if task.CountsForTrust(events.Result{Outcome: rec.Outcome, ErrorClass: rec.ErrorClass}) {
				o := trust.Outcome{Key: services.MsgID(id, rec.Pass, "outcome"), Success: rec.Outcome == events.OutcomeSuccess, At: rec.At}
				recorded[o.Key] = o
				implied[st.Type], _ = trust.Insert(implied[st.Type], o, trust.Keep)
				total[st.Type]++
			}
			spent := events.Result{TokensIn: rec.TokensIn, TokensOut: rec.TokensOut, Cost: rec.Cost}
			if tokens, cost := task.DailySpend(spent, c.in.Policy.For(st.Type).DailyBudget); tokens != 0 || cost != 0 {
				k := [2]string{st.Type, trust.Day(rec.At)}
				d := want[k]
				d.Type, d.Day = k[0], k[1]
				d.Tokens += int64(tokens)
				d.NanoUSD += trust.NanoUSD(cost)
				want[k] = d
			}
		}
	}
	return recorded, implied, total, want
}

// spendDrift checks the spend counters against want, what the recorded
// attempts spent.
func (c *checker) spendDrift(ctx context.Context, want map[[2]string]trust.DaySpend) error {
	have, err := trust.NewSpending(c.in.JS, services.CounterStream).All(ctx)
	if err != nil {
		return fmt.Errorf("spend counters: %w", err)
	}
	keys := map[string][2]string{}
	for k := range have {
		keys[k[0]+"/"+k[1]] = k
	}
	for k := range want {
		keys[k[0]+"/"+k[1]] = k
	}
	for _, name := range slices.Sorted(maps.Keys(keys)) {
		live, rec := have[keys[name]], want[keys[name]]
		if live.Tokens != rec.Tokens || live.NanoUSD != rec.NanoUSD {
			c.r.CounterDrift++
			c.problem("", KindDrift, "spend of %s: %d tokens $%.6f counted, %d tokens $%.6f recorded (%+d tokens)",
				name, live.Tokens, float64(live.NanoUSD)/1e9, rec.Tokens, float64(rec.NanoUSD)/1e9, live.Tokens-rec.Tokens)
		}
	}
	return nil
}

// rebuild runs what `dispatch rebuild` runs and reports every difference.
func (c *checker) rebuild(ctx context.Context) error {
	rebuilt, err := rebuild.Replay(ctx, c.in.JS, rebuild.Options{Policy: c.in.Policy, Scoring: c.in.Scoring})
	if err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	live, err := services.OpenStores(ctx, c.in.JS)
	if err != nil {
		return err
	}
	diffs, err := rebuild.Compare(ctx, rebuild.Live{Tasks: live.Tasks, Trust: live.Trust, History: live.History, Held: live.Held, JS: c.in.JS,
		Spending: trust.NewSpending(c.in.JS, services.CounterStream)}, rebuilt)
	if err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	c.r.RebuildDiffs = len(diffs)
	traced := map[string]bool{}
	for _, d := range diffs {
		task := ""
		if d.Store == services.BucketTasks {
			task = d.Key
		}
		if te := c.v.tasks[task]; te != nil && !traced[task] {
			// The task's first difference shows what the stream holds of
			// it, to read the differences by.
			traced[task] = true
			c.problem(task, KindRebuild, "%s; the task's events: %s", d, strings.Join(te.trail, " "))
			continue
		}
		c.problem(task, KindRebuild, "%s", d)
	}
	return nil
}
