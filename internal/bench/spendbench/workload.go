package spendbench

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
)

// Task is one task of a workload.
type Task struct {
	ID string `json:"id"`
	// Type is the task type the runners submit it as. In the mix
	// workloads it is the scenario (one type per behaviour); in the long
	// tail and the regression several types share a scenario and one type
	// may mix scenarios.
	Type string `json:"type"`
	// Scenario is how the scripted server answers the task's calls.
	Scenario string `json:"scenario"`
	// Class groups the task in the report (ClassHealthy, ClassBroken, …);
	// empty in the mix workloads, which report per scenario only.
	Class   string          `json:"class,omitempty"`
	Subject string          `json:"subject"`
	Payload json.RawMessage `json:"payload"`
}

// TaskType is the type the task is submitted as: Type, or its scenario
// when Type is empty.
func (t Task) TaskType() string {
	if t.Type != "" {
		return t.Type
	}
	return t.Scenario
}

// Workload configures Generate.
type Workload struct {
	// Shape is the workload's shape: ShapeDefault (""), ShapeSteady,
	// ShapeBatch, ShapeLongTail or ShapeRegression (see Shapes).
	Shape string
	// Tasks is how many tasks of a mix shape (default, steady, batch).
	// Default: the shape's. The long tail and the regression have a fixed
	// size and ignore it.
	Tasks int
	// Mix is the share of each scenario of a mix shape. Default: the
	// shape's (DefaultMix, SteadyMix, BatchMix).
	Mix []Share
	// ContextTokens sizes the filler "context" text of every payload, in
	// tokens of about 4 characters. Default 1000 (PromptLong); negative
	// means none (PromptShort).
	ContextTokens int
	// RepeatSubjects is the probability that a task reuses the subject of
	// an earlier task of its type (so its prompt carries that task's
	// outcomes). Default: the shape's (0.15; 0.35 for the steady stream);
	// negative means never.
	RepeatSubjects float64
	// Seed makes the workload reproducible. Default 1.
	Seed uint64
	// Prefix starts every task id. Default "sb".
	Prefix string
}

// Workload shapes.
const (
	// ShapeDefault: DefaultMix, 300 tasks, one type per scenario.
	ShapeDefault = "default"
	// ShapeSteady: a steady stream of 8 types (SteadyMix) whose subjects
	// recur, 240 tasks.
	ShapeSteady = "steady"
	// ShapeBatch: a small mixed batch of 42 tasks of 9 behaviours
	// (BatchMix).
	ShapeBatch = "batch"
	// ShapeLongTail: LongTailTypes new types of LongTailPerType tasks each:
	// most healthy, some hopeless, some of mixed difficulty.
	ShapeLongTail = "longtail"
	// ShapeRegression: one type healthy, then regressed (hopeless), then
	// fixed (healthy again), with two control types throughout, in order.
	ShapeRegression = "regression"
)

// ShapeInfo describes a workload shape.
type ShapeInfo struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Modes are the delivery modes the shape runs in by default.
	Modes []string `json:"modes"`
	// Fixed shapes have a set number of tasks (Workload.Tasks is ignored).
	Fixed bool `json:"fixed"`
}

// Shapes lists every workload shape.
var Shapes = []ShapeInfo{
	{ShapeDefault, "today's mix: 300 tasks, 10 behaviours, one type per behaviour", []string{ModeOnce, ModeSteady}, false},
	{ShapeSteady, "steady stream: 240 tasks of 8 types, subjects recur (35 %)", []string{ModeSteady}, false},
	{ShapeBatch, "small mixed batch: 42 tasks of 9 behaviours, one type per behaviour", []string{ModeOnce, ModeSteady}, false},
	{ShapeLongTail, fmt.Sprintf("long tail of new types: %d types × %d tasks; %d healthy types, %d hopeless, %d mixed (%d of %d succeed at once, the rest never)",
		LongTailTypes, LongTailPerType, LongTailTypes-LongTailHopeless-LongTailMixed, LongTailHopeless, LongTailMixed, LongTailMixedSolvable, LongTailPerType),
		[]string{ModeOnce, ModeSteady}, true},
	{ShapeRegression, fmt.Sprintf("regression and its fix: type %s healthy for %d tasks, hopeless for %d, healthy for %d; control types %s (healthy) and %s (flaky) throughout, %d tasks each",
		RegressionType, RegressionBefore, RegressionBroken, RegressionAfter, RegressionControlA, RegressionControlB, RegressionControlTasks),
		[]string{ModeSteady}, true},
}

// LookupShape returns the shape of that name ("" is ShapeDefault).
func LookupShape(name string) (ShapeInfo, bool) {
	if name == "" {
		name = ShapeDefault
	}
	for _, s := range Shapes {
		if s.Name == name {
			return s, true
		}
	}
	return ShapeInfo{}, false
}

// ShapeNames are the shapes' names, in Shapes order.
func ShapeNames() []string {
	names := make([]string, len(Shapes))
	for i, s := range Shapes {
		names[i] = s.Name
	}
	return names
}

// Prompt sizes: the filler context of every payload.
const (
	// PromptShort: no filler, the payload is the issue line alone.
	PromptShort = "short"
	// PromptLong: about 1,000 tokens (4,000 characters) of filler.
	PromptLong = "long"
)

// PromptContextTokens is Workload.ContextTokens for a prompt size.
func PromptContextTokens(size string) (int, bool) {
	switch size {
	case PromptShort:
		return -1, true
	case PromptLong:
		return 1000, true
	}
	return 0, false
}

// Report classes.
const (
	// Long tail: the class of the task's type.
	ClassHealthy  = "healthy"
	ClassHopeless = "hopeless"
	ClassMixed    = "mixed"
	// Regression: the regressed type's phases, and the control types.
	ClassBefore  = "before"
	ClassBroken  = "broken"
	ClassAfter   = "after_fix"
	ClassControl = "control"
)

// Classes lists every class, in report order.
var Classes = []string{ClassHealthy, ClassMixed, ClassHopeless, ClassBefore, ClassBroken, ClassAfter, ClassControl}

// The long tail's shape.
const (
	LongTailTypes    = 40
	LongTailPerType  = 5
	LongTailHopeless = 6
	LongTailMixed    = 6
	// LongTailMixedSolvable of a mixed type's tasks succeed at once; the
	// rest never succeed.
	LongTailMixedSolvable = 2
)

// The regression's shape.
const (
	RegressionType         = "reg_target"
	RegressionControlA     = "reg_control_a"
	RegressionControlB     = "reg_control_b"
	RegressionBefore       = 80
	RegressionBroken       = 60
	RegressionAfter        = 100
	RegressionControlTasks = 40
)

func (w Workload) withDefaults() Workload {
	if w.Shape == "" {
		w.Shape = ShapeDefault
	}
	switch w.Shape {
	case ShapeLongTail:
		w.Tasks = LongTailTypes * LongTailPerType
	case ShapeRegression:
		w.Tasks = RegressionBefore + RegressionBroken + RegressionAfter + 2*RegressionControlTasks
	case ShapeSteady:
		if w.Tasks <= 0 {
			w.Tasks = 240
		}
		if len(w.Mix) == 0 {
			w.Mix = SteadyMix
		}
		if w.RepeatSubjects == 0 {
			w.RepeatSubjects = 0.35
		}
	case ShapeBatch:
		if w.Tasks <= 0 {
			w.Tasks = 42
		}
		if len(w.Mix) == 0 {
			w.Mix = BatchMix
		}
	}
	if w.Tasks <= 0 {
		w.Tasks = 300
	}
	if len(w.Mix) == 0 && !isFixed(w.Shape) {
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

func isFixed(shape string) bool {
	s, ok := LookupShape(shape)
	return ok && s.Fixed
}

// slot is a task of a workload before its id, subject and payload.
type slot struct{ typ, scenario, class string }

// Generate makes the workload. A mix shape draws the scenarios in the
// proportions of the mix (largest remainder, so the counts add up to
// Tasks), one type per scenario, in a shuffled order; the long tail draws
// its types' classes and shuffles its tasks; the regression keeps its
// phases in order, the control tasks spread evenly among them. Every task
// gets a subject (mostly distinct per type, some repeated) and a payload
// carrying the scenario, the ticket (the task id), an issue line and the
// filler context. The same Workload always gives the same tasks; an
// unknown shape gives none.
func Generate(w Workload) []Task {
	w = w.withDefaults()
	rng := rand.New(rand.NewPCG(w.Seed, 0x5bd1e995))
	var slots []slot
	switch w.Shape {
	case ShapeLongTail:
		slots = longTailSlots(rng)
	case ShapeRegression:
		slots = regressionSlots()
	case ShapeDefault, ShapeSteady, ShapeBatch:
		for _, sc := range apportion(w.Mix, w.Tasks) {
			slots = append(slots, slot{typ: sc, scenario: sc})
		}
		rng.Shuffle(len(slots), func(i, j int) { slots[i], slots[j] = slots[j], slots[i] })
	}

	subjects := map[string][]string{}
	tasks := make([]Task, len(slots))
	for i, s := range slots {
		id := fmt.Sprintf("%s-%04d", w.Prefix, i+1)
		var subject string
		if prev := subjects[s.typ]; len(prev) > 0 && rng.Float64() < w.RepeatSubjects {
			subject = prev[rng.IntN(len(prev))]
		} else {
			subject = fmt.Sprintf("src/%s/%s_%d.go", s.typ, words[rng.IntN(len(words))], len(prev)+1)
			subjects[s.typ] = append(prev, subject)
		}
		payload := map[string]string{
			"scenario": s.scenario,
			"ticket":   id,
			"issue":    fmt.Sprintf("%s (scenario=%s ticket=%s)", issues[rng.IntN(len(issues))], s.scenario, id),
		}
		if w.ContextTokens > 0 {
			payload["context"] = filler(rng, w.ContextTokens*4)
		}
		data, err := json.Marshal(payload)
		if err != nil {
			panic(err) // a map of strings always encodes
		}
		tasks[i] = Task{ID: id, Type: s.typ, Scenario: s.scenario, Class: s.class, Subject: subject, Payload: data}
	}
	return tasks
}

// longTailSlots: LongTailTypes types named tail_01…, their classes drawn
// at random (LongTailHopeless hopeless, LongTailMixed mixed, the rest
// healthy); a mixed type's LongTailMixedSolvable healthy tasks drawn among
// its LongTailPerType; every task shuffled.
func longTailSlots(rng *rand.Rand) []slot {
	classOf := make([]string, LongTailTypes)
	for i := range classOf {
		switch {
		case i < LongTailHopeless:
			classOf[i] = ClassHopeless
		case i < LongTailHopeless+LongTailMixed:
			classOf[i] = ClassMixed
		default:
			classOf[i] = ClassHealthy
		}
	}
	rng.Shuffle(len(classOf), func(i, j int) { classOf[i], classOf[j] = classOf[j], classOf[i] })
	var slots []slot
	for i, class := range classOf {
		typ := fmt.Sprintf("tail_%02d", i+1)
		scenarios := make([]string, LongTailPerType)
		for j := range scenarios {
			switch {
			case class == ClassHopeless, class == ClassMixed && j >= LongTailMixedSolvable:
				scenarios[j] = Hopeless
			default:
				scenarios[j] = Healthy
			}
		}
		rng.Shuffle(len(scenarios), func(a, b int) { scenarios[a], scenarios[b] = scenarios[b], scenarios[a] })
		for _, sc := range scenarios {
			slots = append(slots, slot{typ: typ, scenario: sc, class: class})
		}
	}
	rng.Shuffle(len(slots), func(i, j int) { slots[i], slots[j] = slots[j], slots[i] })
	return slots
}

// regressionSlots: the regressed type's phases in order (RegressionBefore
// healthy, RegressionBroken hopeless, RegressionAfter healthy) and the two
// control types' tasks (healthy, flaky) spread evenly among them,
// alternating. Nothing is drawn at random: the phases are the point.
func regressionSlots() []slot {
	var target []slot
	for range RegressionBefore {
		target = append(target, slot{RegressionType, Healthy, ClassBefore})
	}
	for range RegressionBroken {
		target = append(target, slot{RegressionType, Hopeless, ClassBroken})
	}
	for range RegressionAfter {
		target = append(target, slot{RegressionType, Healthy, ClassAfter})
	}
	controls := 2 * RegressionControlTasks
	n := len(target) + controls
	slots := make([]slot, 0, n)
	ti, ci := 0, 0
	for i := range n {
		// Control task ci goes where it keeps the controls' share of the
		// first i+1 tasks closest to theirs overall (Bresenham).
		if ci < controls && (ti == len(target) || (ci+1)*n <= (i+1)*controls) {
			if ci%2 == 0 {
				slots = append(slots, slot{RegressionControlA, Healthy, ClassControl})
			} else {
				slots = append(slots, slot{RegressionControlB, Flaky, ClassControl})
			}
			ci++
			continue
		}
		slots = append(slots, target[ti])
		ti++
	}
	return slots
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
