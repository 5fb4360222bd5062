package spendbench

import (
	"encoding/json"
	"math"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// outcome is how one task ended for a runner.
type outcome struct {
	status   string // the mesh's terminal status; the loop's "succeeded" or "gave_up"; "missing"
	resolved bool
	ended    bool // a terminal status (mesh) or a result (loop)
	// endRecords counts the task's end records (mesh: on the stream; loop: 1).
	endRecords int
	poison     bool
	// clientTokens is what the runner itself recorded (mesh: the task state).
	clientTokens int
	mesh         *events.TaskState
	// seconds is from the task's submission until it was seen ended (0:
	// not ended).
	seconds float64
}

// Tally is the figures of a set of tasks, from the server's ledger.
type Tally struct {
	Tasks    int `json:"tasks"`
	Resolved int `json:"resolved"`
	// Tokens is every token billed (prompt + completion).
	Tokens    int `json:"tokens"`
	TokensIn  int `json:"tokens_in"`
	TokensOut int `json:"tokens_out"`
	// TokensPerResolved is Tokens / Resolved.
	TokensPerResolved Ratio `json:"tokens_per_resolved"`
	// WastedTokens were billed to tasks that ended unresolved.
	WastedTokens int `json:"wasted_tokens"`
	// Solvable counts the tasks of a scenario some client resolves
	// (Resolvable); SolvableUnresolved those of them that did not end
	// succeeded or cancelled: with a human, held, failed, given up (the
	// loop), or not ended at all.
	Solvable           int `json:"solvable"`
	SolvableUnresolved int `json:"solvable_unresolved"`
	// MeanSecondsToEnd is the mean time from a task's submission until it
	// was seen ended, over the tasks that ended.
	MeanSecondsToEnd Ratio `json:"mean_seconds_to_end"`
	timed            int
	secondsSum       float64
	// Calls is every request the server received; TransientCalls those it
	// answered with 503 or a 429 rate limit.
	Calls          int `json:"calls"`
	TransientCalls int `json:"transient_calls"`
	// Attempts are the calls that did not get a transient answer (200
	// answers and deterministic errors); Retries the attempts after a
	// task's first; RetrySuccesses the retries answered with a success.
	Attempts         int   `json:"attempts"`
	Retries          int   `json:"retries"`
	RetrySuccesses   int   `json:"retry_successes"`
	RetrySuccessRate Ratio `json:"retry_success_rate"`
	// IdenticalAfterDeterministic counts requests identical (same body
	// hash) to one of the same task that got a deterministic error (400,
	// 401, 429 insufficient_quota).
	IdenticalAfterDeterministic int `json:"identical_after_deterministic"`
	// CallsAfterAuthOrQuota counts a task's calls after it got a 401 or
	// an insufficient_quota answer.
	CallsAfterAuthOrQuota int `json:"calls_after_auth_or_quota"`
}

// RungTokens is the mesh's prompt tokens per call on one rung, from the
// attempt records of its task states.
type RungTokens struct {
	Calls          int   `json:"calls"`
	PromptTokens   int   `json:"prompt_tokens"`
	PromptPerCall  Ratio `json:"prompt_tokens_per_call"`
	ResolvedOnRung int   `json:"resolved_on_rung"`
}

// TaskResult is one task's figures.
type TaskResult struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Scenario string `json:"scenario"`
	Class    string `json:"class,omitempty"`
	// Status is how the task ended (mesh: its task status; loop:
	// succeeded or gave_up; "missing" when the runner has no record).
	Status   string `json:"status"`
	Resolved bool   `json:"resolved"`
	// Ended: the mesh holds a terminal state, the loop returned a result.
	Ended bool `json:"ended"`
	// EndRecords counts the task's end records: the mesh's succeeded,
	// cancelled, gated, escalated, stuck and poison records on the stream;
	// 1 for a loop task with a result.
	EndRecords int `json:"end_records"`
	// Calls, Attempts and Tokens come from the server's ledger;
	// SuccessAnswers counts the success answers it gave.
	Calls          int `json:"calls"`
	Attempts       int `json:"attempts"`
	Tokens         int `json:"tokens"`
	SuccessAnswers int `json:"success_answers"`
	// MeshAttempts is the mesh's attempt count (TaskState.Attempts) less
	// its refusals (requests it did not send); MeshTokens what its task
	// state recorded.
	MeshAttempts int `json:"mesh_attempts,omitempty"`
	MeshTokens   int `json:"mesh_tokens,omitempty"`
}

// Figures are one runner's figures on one workload in one delivery mode.
type Figures struct {
	Runner string `json:"runner"`
	Mode   string `json:"mode"`
	Tally
	// Statuses counts the tasks by how they ended.
	Statuses map[string]int `json:"statuses"`
	// NotEnded counts tasks without a terminal state (mesh) or result
	// (loop); BadEndRecords tasks whose end records are not exactly one;
	// Poison tasks with a poison record.
	NotEnded      int `json:"not_ended"`
	BadEndRecords int `json:"bad_end_records"`
	// Held counts tasks the mesh holds for their type's trust at the end
	// (settled, not ended: no end record yet).
	Held   int `json:"held"`
	Poison int `json:"poison"`
	// SuccessNotResolved counts tasks the server gave a success answer that
	// did not end resolved; ResolvedWithoutSuccess the reverse.
	SuccessNotResolved     int `json:"success_not_resolved"`
	ResolvedWithoutSuccess int `json:"resolved_without_success"`
	// UnassignedCalls are requests naming no ticket (none expected).
	UnassignedCalls int `json:"unassigned_calls"`
	// The mesh's own bookkeeping, checked against the ledger:
	// TransientCountedAsAttempts sums, over tasks, the attempts the mesh
	// counted beyond the non-transient calls the server saw (refusals,
	// which send nothing, excluded) and OvercountedTasks counts those
	// tasks; UncountedAttempts sums the server's attempts the mesh did not
	// count; Refused counts requests the mesh refused to send; MeshTokens
	// is what its task states recorded (vs Tokens, what was billed).
	TransientCountedAsAttempts int                   `json:"transient_counted_as_attempts"`
	OvercountedTasks           int                   `json:"overcounted_tasks"`
	UncountedAttempts          int                   `json:"uncounted_attempts"`
	Refused                    int                   `json:"refused"`
	MeshTokens                 int                   `json:"mesh_tokens"`
	PromptTokensByRung         map[string]RungTokens `json:"prompt_tokens_by_rung,omitempty"`
	// WallSeconds is from the first submission until every task ended;
	// SecondsPerTask is WallSeconds / Tasks.
	WallSeconds    float64 `json:"wall_seconds"`
	SecondsPerTask Ratio   `json:"seconds_per_task"`
	// ByScenario are the figures per scenario (in the mix workloads, =
	// task type).
	ByScenario map[string]Tally `json:"by_scenario"`
	// ByClass are the figures per report class (Task.Class), when the
	// workload has classes (the long tail, the regression).
	ByClass map[string]Tally `json:"by_class,omitempty"`
	// Results is every task's figures, in workload order.
	Results []TaskResult `json:"-"`
}

// figures computes a runner's figures from the server's ledger and how each
// task ended.
func figures(runner, mode string, tasks []Task, outcomes map[string]outcome, ledger map[string][]Call, unassigned []Call) Figures {
	f := Figures{Runner: runner, Mode: mode, Statuses: map[string]int{}, ByScenario: map[string]Tally{}, UnassignedCalls: len(unassigned)}
	if runner == RunnerMesh {
		f.PromptTokensByRung = map[string]RungTokens{}
	}
	for _, t := range tasks {
		o := outcomes[t.ID]
		tt, res := tally(t, o, ledger[t.ID])
		f.note(o, tt, &res)
		f.add(t, tt)
		f.Results = append(f.Results, res)
	}
	f.Tally.finish()
	for _, m := range []map[string]Tally{f.ByScenario, f.ByClass} {
		for k, s := range m {
			s.finish()
			m[k] = s
		}
	}
	for k, r := range f.PromptTokensByRung {
		r.PromptPerCall = ratio(float64(r.PromptTokens), float64(r.Calls))
		f.PromptTokensByRung[k] = r
	}
	return f
}

// tally is what task t's calls add up to, ended as o.
func tally(t Task, o outcome, calls []Call) (Tally, TaskResult) {
	var tt Tally
	tt.Tasks = 1
	if o.resolved {
		tt.Resolved = 1
	}
	if Resolvable(t.Scenario) {
		tt.Solvable = 1
		if o.status != string(events.StatusSucceeded) && o.status != string(events.StatusCancelled) {
			tt.SolvableUnresolved = 1
		}
	}
	if o.ended && o.seconds > 0 {
		tt.timed, tt.secondsSum = 1, o.seconds
	}
	res := TaskResult{ID: t.ID, Type: t.TaskType(), Scenario: t.Scenario, Class: t.Class, Status: o.status, Resolved: o.resolved, Ended: o.ended, EndRecords: o.endRecords, Calls: len(calls)}
	banned := map[string]bool{}
	stopped := false
	for _, c := range calls {
		tt.Calls++
		tt.TokensIn += c.TokensIn
		tt.TokensOut += c.TokensOut
		if stopped {
			tt.CallsAfterAuthOrQuota++
		}
		if banned[c.Hash] {
			tt.IdenticalAfterDeterministic++
		}
		if c.Deterministic() {
			banned[c.Hash] = true
		}
		stopped = stopped || c.Stop()
		if c.Kind == kindSuccess {
			res.SuccessAnswers++
		}
		if c.Transient() {
			tt.TransientCalls++
			continue
		}
		tt.Attempts++
		if tt.Attempts > 1 {
			tt.Retries++
			if c.Kind == kindSuccess {
				tt.RetrySuccesses++
			}
		}
	}
	tt.Tokens = tt.TokensIn + tt.TokensOut
	if !o.resolved {
		tt.WastedTokens = tt.Tokens
	}
	res.Attempts, res.Tokens = tt.Attempts, tt.Tokens
	return tt, res
}

// note counts how a task ended (o) and what the mesh counted of it;
// res takes the mesh's figures of the task.
func (f *Figures) note(o outcome, tt Tally, res *TaskResult) {
	f.Statuses[o.status]++
	switch {
	case o.status == string(events.StatusHeld):
		f.Held++
	case !o.ended:
		f.NotEnded++
	}
	if o.endRecords != 1 && o.status != string(events.StatusHeld) {
		f.BadEndRecords++
	}
	if o.poison {
		f.Poison++
	}
	if res.SuccessAnswers > 0 && !o.resolved {
		f.SuccessNotResolved++
	}
	if res.SuccessAnswers == 0 && o.resolved {
		f.ResolvedWithoutSuccess++
	}
	if st := o.mesh; st != nil {
		res.MeshAttempts = st.Attempts - st.Refused
		res.MeshTokens = o.clientTokens
		f.Refused += st.Refused
		f.MeshTokens += o.clientTokens
		if d := res.MeshAttempts - tt.Attempts; d > 0 {
			f.TransientCountedAsAttempts += d
			f.OvercountedTasks++
		} else if d < 0 {
			f.UncountedAttempts -= d
		}
		for _, h := range st.History {
			if h.TokensIn == 0 {
				continue // refused: nothing was sent
			}
			r := f.PromptTokensByRung[string(h.Rung)]
			r.Calls++
			r.PromptTokens += h.TokensIn
			if h.Outcome == events.OutcomeSuccess {
				r.ResolvedOnRung++
			}
			f.PromptTokensByRung[string(h.Rung)] = r
		}
	}
}

// add adds a task's tally to the totals, its scenario's and its class's.
func (f *Figures) add(t Task, tt Tally) {
	f.Tally.add(tt)
	s := f.ByScenario[t.Scenario]
	s.add(tt)
	f.ByScenario[t.Scenario] = s
	if t.Class != "" {
		if f.ByClass == nil {
			f.ByClass = map[string]Tally{}
		}
		c := f.ByClass[t.Class]
		c.add(tt)
		f.ByClass[t.Class] = c
	}
}

// setWall records the run's wall time.
func (f *Figures) setWall(wall time.Duration) {
	f.WallSeconds = wall.Seconds()
	f.SecondsPerTask = ratio(f.WallSeconds, float64(f.Tasks))
}

func (t *Tally) add(u Tally) {
	t.Tasks += u.Tasks
	t.Resolved += u.Resolved
	t.Tokens += u.Tokens
	t.TokensIn += u.TokensIn
	t.TokensOut += u.TokensOut
	t.WastedTokens += u.WastedTokens
	t.Calls += u.Calls
	t.TransientCalls += u.TransientCalls
	t.Attempts += u.Attempts
	t.Retries += u.Retries
	t.RetrySuccesses += u.RetrySuccesses
	t.IdenticalAfterDeterministic += u.IdenticalAfterDeterministic
	t.CallsAfterAuthOrQuota += u.CallsAfterAuthOrQuota
	t.Solvable += u.Solvable
	t.SolvableUnresolved += u.SolvableUnresolved
	t.timed += u.timed
	t.secondsSum += u.secondsSum
}

func (t *Tally) finish() {
	t.TokensPerResolved = ratio(float64(t.Tokens), float64(t.Resolved))
	t.MeanSecondsToEnd = ratio(t.secondsSum, float64(t.timed))
	t.RetrySuccessRate = ratio(float64(t.RetrySuccesses), float64(t.Retries))
}

// Ratio is a quotient that may be undefined (a zero denominator): NaN, and
// null in JSON.
type Ratio float64

func ratio(a, b float64) Ratio {
	if b == 0 {
		return Ratio(math.NaN())
	}
	return Ratio(a / b)
}

// Defined reports whether the ratio has a value.
func (r Ratio) Defined() bool { return !math.IsNaN(float64(r)) && !math.IsInf(float64(r), 0) }

func (r Ratio) MarshalJSON() ([]byte, error) {
	if !r.Defined() {
		return []byte("null"), nil
	}
	return json.Marshal(float64(r))
}

func (r *Ratio) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*r = Ratio(math.NaN())
		return nil
	}
	var v float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = Ratio(v)
	return nil
}

// Comparison is the mesh against the naive loop on one workload in one
// delivery mode.
type Comparison struct {
	// Workload is the workload's shape.
	Workload string  `json:"workload"`
	Mode     string  `json:"mode"`
	Tasks    int     `json:"tasks"`
	Seed     uint64  `json:"seed"`
	Mesh     Figures `json:"mesh"`
	Loop     Figures `json:"loop"`
	// TokensPerResolved and WastedTokens are mesh / loop.
	TokensPerResolved Ratio `json:"tokens_per_resolved_ratio"`
	WastedTokens      Ratio `json:"wasted_tokens_ratio"`
	// LoopResolvedMeshNot counts tasks the loop resolved and the mesh did
	// not; CarryOverUnresolved the fixable and history tasks the mesh left
	// unresolved; ResolvableUnresolved every task of a resolvable scenario
	// the mesh left unresolved.
	LoopResolvedMeshNot  int `json:"loop_resolved_mesh_not"`
	CarryOverUnresolved  int `json:"carry_over_unresolved"`
	ResolvableUnresolved int `json:"resolvable_unresolved"`
}

func compare(cfg Config, tasks []Task, m, l Figures) Comparison {
	c := Comparison{
		Workload: cfg.Workload.Shape, Mode: cfg.Mode, Tasks: len(tasks), Seed: cfg.Workload.Seed, Mesh: m, Loop: l,
		TokensPerResolved: ratio(float64(m.TokensPerResolved), float64(l.TokensPerResolved)),
		WastedTokens:      ratio(float64(m.WastedTokens), float64(l.WastedTokens)),
	}
	loopResolved := map[string]bool{}
	for _, r := range l.Results {
		loopResolved[r.ID] = r.Resolved
	}
	for _, r := range m.Results {
		if r.Resolved {
			continue
		}
		if loopResolved[r.ID] {
			c.LoopResolvedMeshNot++
		}
		if NeedsCarryOver(r.Scenario) {
			c.CarryOverUnresolved++
		}
		if Resolvable(r.Scenario) {
			c.ResolvableUnresolved++
		}
	}
	return c
}
