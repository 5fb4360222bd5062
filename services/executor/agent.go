package executor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// runAgent runs the type's agent command (policy executor "command") with
// the prompt as text on stdin and reads the structured result from its
// stdout. Exit 0 is parsed like a model answer; exit 75 (EX_TEMPFAIL) is
// transient; a timeout is ErrorClassTimeout; a command that cannot run
// (not installed, not executable, exit 126 or 127 from a shell) is
// ErrorClassConfig, the deployment's fault; any other exit, and a death by
// a signal (its CPU time limit, a crash), is deterministic, with the
// output's tail as the error.
func (s *Service) runAgent(ctx context.Context, a *attempt) (events.Result, error) {
	argv := a.pol.Command
	name := "command"
	if len(argv) > 0 {
		name = "command:" + filepath.Base(argv[0])
	}
	// The request is the prompt as this command sees it: its argv stands in
	// for the model name, so a changed command is a changed request.
	req := Request{Model: "command:" + strings.Join(argv, "\x00"), Messages: PromptMessages(a.in.Prompt.Messages)}
	a.endpoint, a.model = name, name
	hash := RequestHash(req)
	if class, ok := a.f.bannedNow[hash]; ok && a.f.redelivered {
		return s.failedAgain(ctx, a, hash, class)
	}
	if a.f.failed[hash] {
		return s.refuse(ctx, a, hash, a.f.unbilled)
	}
	key, label := stateKey("circuit", name), name
	ok, probe, wait, state := s.models.allow(ctx, key, label, s.cfg.Now())
	s.metrics.circuitState(name, state)
	if !ok {
		s.metrics.snooze.WithLabelValues(snoozeCircuit).Observe(wait.Seconds())
		s.cfg.Log.Info("circuit open: snoozed without calling", "task", a.in.Task.ID, "command", name, "delay", wait)
		return events.Result{}, services.Snooze(wait, fmt.Errorf("%s: %w", name, ErrCircuitOpen))
	}
	o := outcome{hash: hash}
	run, err := runCommand(ctx, argv, "", []byte(PromptText(a.in.Prompt.Messages)), s.cfg.AgentEnv, s.cfg.AgentLimits, time.Duration(a.pol.CommandTimeout), true)
	if err != nil && ctx.Err() != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keepTimeout)
		defer cancel()
		s.models.release(rctx, key, label, s.cfg.Now(), probe)
		o.err = ctx.Err()
		return s.conclude(ctx, a, o)
	}
	class := Classify(err, s.rules).Class
	state, opened := s.models.done(ctx, key, label, s.cfg.Now(), probe, class == events.ErrorClassTransient)
	s.metrics.called(name, class, state, opened)
	if err != nil {
		o.err, o.endpoint = err, name
		return s.conclude(ctx, a, o)
	}
	o.final = Response{Content: run.stdout}
	u := readUsage(run.stdout)
	o.model, o.tokensIn, o.tokensOut, o.cost = u.Model, u.TokensIn, u.TokensOut, u.Cost
	if o.cost == 0 {
		o.cost = s.cost(u.Model, Response{TokensIn: u.TokensIn, TokensOut: u.TokensOut})
	}
	model := cmp.Or(u.Model, name)
	s.metrics.usage(model, a.in.Task.Type, o.tokensIn, o.tokensOut, o.cost)
	return s.conclude(ctx, a, o)
}

// usage is what an agent command may report of its spending, next to the
// structured result: {"status":…, "model":"…", "tokens_in":N, "tokens_out":N, "cost":USD}.
type usage struct {
	Model     string  `json:"model"`
	TokensIn  int     `json:"tokens_in"`
	TokensOut int     `json:"tokens_out"`
	Cost      float64 `json:"cost"`
}

// readUsage reads the optional usage fields of a command's result; anything
// unreadable counts as nothing reported.
func readUsage(stdout string) usage {
	var u usage
	start, end := strings.IndexByte(stdout, '{'), strings.LastIndexByte(stdout, '}')
	if start < 0 || end < start {
		return u
	}
	if json.Unmarshal([]byte(stdout[start:end+1]), &u) != nil || u.TokensIn < 0 || u.TokensOut < 0 || u.Cost < 0 {
		return usage{}
	}
	return u
}

// PromptText renders a prompt for an agent command's stdin: the system
// messages first, then the others in order, each under a "[role]" line.
func PromptText(ms []events.Message) string {
	ordered := slices.Clone(ms)
	slices.SortStableFunc(ordered, func(a, b events.Message) int {
		switch {
		case a.Role == RoleSystem && b.Role != RoleSystem:
			return -1
		case a.Role != RoleSystem && b.Role == RoleSystem:
			return 1
		}
		return 0
	})
	var b strings.Builder
	for i, m := range ordered {
		if i > 0 {
			b.WriteString("\n\n")
		}
		b.WriteString("[" + m.Role + "]\n")
		b.WriteString(strings.TrimRight(m.Content, "\n"))
	}
	b.WriteString("\n")
	return b.String()
}

// commandStep finds the pipeline step a pass runs when it is a command step.
func commandStep(pol policy.Type, name string) (policy.Step, bool) {
	for _, st := range pol.Steps {
		if st.Name == name && name != "" {
			return st, st.Run == ExecutorCommand
		}
	}
	return policy.Step{}, false
}

// runStep runs a command step (a validator, a test runner) in its Dir with
// the task JSON on stdin. Exit 0 passes (Summary: the output's tail); any
// other exit fails with ErrorClassStep and the combined output's last
// MaxErrorOutput bytes as Error, to be carried back to an earlier step (a
// command a signal killed — its CPU time limit, a crash — says so before
// them); a timeout is ErrorClassTimeout; a command that cannot run (not installed,
// not executable, exit 126 or 127 from a shell) is ErrorClassConfig, with
// the fix first: the deployment's to mend, not an earlier step's.
func (s *Service) runStep(ctx context.Context, in events.Prompted, step policy.Step) (events.Result, error) {
	task, err := json.Marshal(in.Task)
	if err != nil {
		return events.Result{}, err
	}
	r := events.Result{Approach: "step " + step.Name + ": " + strings.Join(step.Command, " ")}
	run, err := runCommand(ctx, step.Command, step.Dir, task, s.cfg.CommandEnv, s.cfg.CommandLimits, time.Duration(step.Timeout), false)
	if err != nil && ctx.Err() != nil {
		return events.Result{}, ctx.Err()
	}
	out := strings.TrimSpace(run.output)
	c := Classify(err, s.rules)
	var ce *CommandError
	killed := errors.As(err, &ce) && ce.Killed
	switch {
	case err == nil:
		r.Outcome, r.Summary = events.OutcomeSuccess, out
	case c.Class == events.ErrorClassTimeout:
		r.Outcome, r.ErrorClass, r.Error = events.OutcomeFailure, events.ErrorClassTimeout, err.Error()
	case c.Class == events.ErrorClassConfig:
		// The step's command cannot run here: no go-back can fix that.
		r.Outcome, r.ErrorClass = events.OutcomeFailure, events.ErrorClassConfig
		r.Error = s.rules.deploymentError(c.Class, err, "step "+step.Name)
	case out != "" && !killed:
		r.Outcome, r.ErrorClass, r.Error = events.OutcomeFailure, events.ErrorClassStep, out
	default:
		r.Outcome, r.ErrorClass, r.Error = events.OutcomeFailure, events.ErrorClassStep, err.Error()
	}
	if r.ErrorClass != "" {
		s.metrics.errors.WithLabelValues(s.metrics.typ(in.Task.Type), string(r.ErrorClass)).Inc()
	}
	return r, nil
}
