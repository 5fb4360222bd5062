package gate

import (
	"maps"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
)

// shadow is the decision the shadow policy (Config.Shadow) would make on
// the pass the gate just decided: the same task.Decide on the same view,
// under the shadow policy's scoring — nil when there is none. The claims
// the live decision took are answered as they were (the type's gate
// facts are one); a claim only the shadow asks is answered on a copy of
// the facts in memory (task.ClaimIn). Nothing is written: the shadow
// never changes what the gate does.
func (s *Service) shadow(in task.GateIn) *events.ShadowDecision {
	snap := s.cfg.Shadow.Snapshot()
	if s.cfg.Shadow == nil || snap.File == nil {
		return nil
	}
	t := in.Task
	pol := snap.For(t.Type)
	sc := pol.Scoring(s.cfg.Scoring).WithDefaults()
	sc.Exempt = []string{} // the policy says which types are exempt
	prior := sc.PriorOf(in.Pool, t.Type)
	sc.Canary = sc.CanariesWith(prior)
	in.Scoring, in.Exempt = sc, pol.IsExempt()
	in.Verdict = sc.EvaluateWith(t.Type, in.Stats, prior, in.Run.Attempt > 1)
	// The day's spend is read when the live policy caps it.
	in.OverBudget = pol.DailyBudget.Exceeded(in.Spent.Tokens, in.Spent.Cost) && !in.Run.Reviewed
	in.Claimed = maps.Clone(in.Claimed)
	facts := in.Stats.Clone()
	out := task.Decide(in)
	for out.Act == task.ActAsk {
		if _, asked := in.Claimed[out.Ask]; asked {
			break // answered already: Decide never asks twice
		}
		var granted bool
		facts, granted = task.ClaimIn(out.Ask, facts, sc, t.ID, out.Run, in.Now)
		in.Claimed[out.Ask] = granted
		out = task.Decide(in)
	}
	return &events.ShadowDecision{Act: out.Act.Kind(), Cause: out.Trust.Cause, Reason: out.Trust.Reason, PolicyRev: snap.Rev}
}
