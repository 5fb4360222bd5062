package spendbench

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// digest identifies a generated workload: ids, scenarios, subjects and
// payloads.
func digest(tasks []Task) string {
	h := sha256.New()
	for _, t := range tasks {
		fmt.Fprintf(h, "%s|%s|%s|%s\n", t.ID, t.Scenario, t.Subject, t.Payload)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// The default workload is the one measured before the workload shapes
// came: the same tasks, subjects and payloads, byte for byte, and every
// task's type is its scenario.
func TestGenerateDefaultUnchanged(t *testing.T) {
	for _, c := range []struct {
		w    Workload
		want string
	}{
		{Workload{}, "fbb6225d4696631cfbca9242eb0e192054f17275e824ab04dfe5c9a43c700b74"},
		{Workload{Shape: ShapeDefault, Seed: 3, Tasks: 40, ContextTokens: 30}, "e915b49bec00f243109023a3713a4bd4d8361c99b2fbc4a76e70bae0cb3c5db8"},
	} {
		tasks := Generate(c.w)
		if got := digest(tasks); got != c.want {
			t.Errorf("%+v: digest %s, want %s", c.w, got, c.want)
		}
		for _, task := range tasks {
			if task.Type != task.Scenario || task.Class != "" {
				t.Fatalf("default workload task %+v: type %q, class %q", task.ID, task.Type, task.Class)
			}
		}
	}
}

// checkTasks checks what every workload guarantees: distinct valid ids,
// valid types, a payload naming the scenario and ticket, reproducibility.
func checkTasks(t *testing.T, w Workload) []Task {
	t.Helper()
	a, b := Generate(w), Generate(w)
	if digest(a) != digest(b) {
		t.Fatalf("%s: two generations differ", w.Shape)
	}
	ids := map[string]bool{}
	for _, task := range a {
		if !events.ValidID(task.ID) || !events.ValidType(task.TaskType()) || ids[task.ID] {
			t.Fatalf("%s: invalid or repeated id or type: %+v", w.Shape, task)
		}
		ids[task.ID] = true
		var p map[string]string
		if err := json.Unmarshal(task.Payload, &p); err != nil || p["scenario"] != task.Scenario || p["ticket"] != task.ID {
			t.Fatalf("%s: payload %s of %+v", w.Shape, task.Payload, task)
		}
	}
	if want := w.withDefaults().Tasks; len(a) != want {
		t.Errorf("%s: %d tasks, withDefaults says %d", w.Shape, len(a), want)
	}
	return a
}

// The long tail: 40 types of 5 tasks; 6 hopeless types (every task
// hopeless), 6 mixed (2 healthy, 3 hopeless), the rest healthy; a type's
// class is the same on all its tasks; the order is shuffled.
func TestGenerateLongTail(t *testing.T) {
	tasks := checkTasks(t, Workload{Shape: ShapeLongTail, Tasks: 7, Seed: 5})
	if len(tasks) != LongTailTypes*LongTailPerType {
		t.Fatalf("%d tasks", len(tasks))
	}
	type tally struct {
		class             string
		healthy, hopeless int
	}
	types := map[string]*tally{}
	for _, task := range tasks {
		tt := types[task.Type]
		if tt == nil {
			tt = &tally{class: task.Class}
			types[task.Type] = tt
		}
		if tt.class != task.Class {
			t.Fatalf("type %s has classes %s and %s", task.Type, tt.class, task.Class)
		}
		switch task.Scenario {
		case Healthy:
			tt.healthy++
		case Hopeless:
			tt.hopeless++
		default:
			t.Fatalf("long tail task of scenario %s", task.Scenario)
		}
	}
	if len(types) != LongTailTypes {
		t.Fatalf("%d types", len(types))
	}
	classes := map[string]int{}
	for typ, tt := range types {
		classes[tt.class]++
		want := map[string][2]int{
			ClassHealthy:  {LongTailPerType, 0},
			ClassHopeless: {0, LongTailPerType},
			ClassMixed:    {LongTailMixedSolvable, LongTailPerType - LongTailMixedSolvable},
		}[tt.class]
		if tt.healthy != want[0] || tt.hopeless != want[1] {
			t.Errorf("type %s (%s): %d healthy, %d hopeless; want %v", typ, tt.class, tt.healthy, tt.hopeless, want)
		}
	}
	if classes[ClassHopeless] != LongTailHopeless || classes[ClassMixed] != LongTailMixed ||
		classes[ClassHealthy] != LongTailTypes-LongTailHopeless-LongTailMixed {
		t.Errorf("types per class %v", classes)
	}
	// Shuffled: the first ten tasks are not all of one or two types.
	first := map[string]bool{}
	for _, task := range tasks[:10] {
		first[task.Type] = true
	}
	if len(first) < 5 {
		t.Errorf("the first ten tasks are of %d types: not shuffled", len(first))
	}
	// Another seed draws other classes.
	if digest(Generate(Workload{Shape: ShapeLongTail, Seed: 6})) == digest(tasks) {
		t.Error("two seeds give the same long tail")
	}
}

// The regression: the target type's phases in order — 80 healthy, 60
// hopeless, 100 healthy — with the two control types spread evenly
// through all of them.
func TestGenerateRegression(t *testing.T) {
	tasks := checkTasks(t, Workload{Shape: ShapeRegression})
	var phases []string // the target's classes, in workload order, run-length encoded
	runs := map[string]int{}
	controls := map[string]int{}
	lastControl, maxGap := -1, 0
	for i, task := range tasks {
		switch task.Type {
		case RegressionType:
			want := map[string]string{ClassBefore: Healthy, ClassBroken: Hopeless, ClassAfter: Healthy}[task.Class]
			if want == "" || task.Scenario != want {
				t.Fatalf("target task %s: class %s scenario %s", task.ID, task.Class, task.Scenario)
			}
			if len(phases) == 0 || phases[len(phases)-1] != task.Class {
				phases = append(phases, task.Class)
			}
			runs[task.Class]++
		case RegressionControlA, RegressionControlB:
			want := map[string]string{RegressionControlA: Healthy, RegressionControlB: Flaky}[task.Type]
			if task.Class != ClassControl || task.Scenario != want {
				t.Fatalf("control task %+v", task)
			}
			controls[task.Type]++
			maxGap = max(maxGap, i-lastControl)
			lastControl = i
		default:
			t.Fatalf("task of type %s", task.Type)
		}
	}
	if strings.Join(phases, ",") != "before,broken,after_fix" {
		t.Errorf("phases in order %v", phases)
	}
	if runs[ClassBefore] != RegressionBefore || runs[ClassBroken] != RegressionBroken || runs[ClassAfter] != RegressionAfter {
		t.Errorf("phase sizes %v", runs)
	}
	if controls[RegressionControlA] != RegressionControlTasks || controls[RegressionControlB] != RegressionControlTasks {
		t.Errorf("control tasks %v", controls)
	}
	if total := RegressionBefore + RegressionBroken + RegressionAfter + 2*RegressionControlTasks; maxGap > total/(2*RegressionControlTasks)+1 ||
		len(tasks)-1-lastControl > total/(2*RegressionControlTasks) {
		t.Errorf("controls not spread evenly: a gap of %d tasks, the last at %d of %d", maxGap, lastControl, len(tasks))
	}
	// Every phase has controls alongside it.
	for _, phase := range []string{ClassBefore, ClassBroken, ClassAfter} {
		first, last := -1, -1
		for i, task := range tasks {
			if task.Class == phase {
				if first < 0 {
					first = i
				}
				last = i
			}
		}
		n := 0
		for _, task := range tasks[first : last+1] {
			if task.Class == ClassControl {
				n++
			}
		}
		if n < 10 {
			t.Errorf("phase %s: %d control tasks among its tasks", phase, n)
		}
	}
}

// The small batch is 42 tasks of 9 behaviours, the steady stream 240
// tasks of 8 with recurring subjects; both one type per behaviour.
func TestGenerateBatchAndSteady(t *testing.T) {
	for _, c := range []struct {
		w          Workload
		tasks      int
		behaviours int
	}{
		{Workload{Shape: ShapeBatch}, 42, 9},
		{Workload{Shape: ShapeSteady}, 240, 8},
	} {
		tasks := checkTasks(t, c.w)
		count := map[string]int{}
		subjects := map[string]bool{}
		for _, task := range tasks {
			if task.Type != task.Scenario || task.Class != "" {
				t.Fatalf("%s: task %+v", c.w.Shape, task)
			}
			count[task.Scenario]++
			subjects[task.Type+" "+task.Subject] = true
		}
		if len(tasks) != c.tasks || len(count) != c.behaviours {
			t.Errorf("%s: %d tasks of %d behaviours, want %d of %d", c.w.Shape, len(tasks), len(count), c.tasks, c.behaviours)
		}
		for _, s := range c.w.withDefaults().Mix {
			if want := int(math.Round(s.Percent * float64(c.tasks) / totalPercent(c.w.withDefaults().Mix))); count[s.Scenario] < want-1 || count[s.Scenario] > want+1 {
				t.Errorf("%s: %s %d tasks, want about %d", c.w.Shape, s.Scenario, count[s.Scenario], want)
			}
		}
		if c.w.Shape == ShapeSteady {
			if rep := len(tasks) - len(subjects); rep < len(tasks)/5 {
				t.Errorf("steady: %d of %d tasks repeat a subject, want subjects to recur", rep, len(tasks))
			}
		}
	}
	if got := Generate(Workload{Shape: ShapeBatch}); len(got) != 42 {
		t.Fatalf("batch: %d tasks", len(got))
	}
	for _, s := range BatchMix {
		n := 0
		for _, task := range Generate(Workload{Shape: ShapeBatch}) {
			if task.Scenario == s.Scenario {
				n++
			}
		}
		if n != int(s.Percent) {
			t.Errorf("batch: %d %s tasks, want %g", n, s.Scenario, s.Percent)
		}
	}
	if len(Generate(Workload{Shape: "nonesuch"})) != 0 {
		t.Error("an unknown shape generated tasks")
	}
}

func totalPercent(mix []Share) float64 {
	total := 0.0
	for _, s := range mix {
		total += s.Percent
	}
	return total
}

// Short prompts carry no filler; long ones about 4,000 characters of it.
func TestPromptSizes(t *testing.T) {
	for _, size := range []string{PromptShort, PromptLong} {
		n, ok := PromptContextTokens(size)
		if !ok {
			t.Fatalf("%s: unknown", size)
		}
		for _, shape := range ShapeNames() {
			for _, task := range Generate(Workload{Shape: shape, ContextTokens: n})[:5] {
				var p map[string]string
				if err := json.Unmarshal(task.Payload, &p); err != nil {
					t.Fatal(err)
				}
				switch c := len(p["context"]); {
				case size == PromptShort && c != 0:
					t.Errorf("%s %s: %d characters of context", shape, size, c)
				case size == PromptLong && (c < 4000 || c > 4100):
					t.Errorf("%s %s: %d characters of context, want ≈4000", shape, size, c)
				}
			}
		}
	}
	if _, ok := PromptContextTokens("medium"); ok {
		t.Error("medium is a prompt size")
	}
}

// The figures count, per class, the solvable tasks that did not end
// succeeded or cancelled (a human, held, given up, never ended), and the
// report prints the class table.
func TestFiguresByClass(t *testing.T) {
	tasks := []Task{
		{ID: "t-1", Type: "a", Scenario: Healthy, Class: ClassAfter},
		{ID: "t-2", Type: "a", Scenario: Healthy, Class: ClassAfter},
		{ID: "t-3", Type: "a", Scenario: Healthy, Class: ClassAfter},
		{ID: "t-4", Type: "a", Scenario: Healthy, Class: ClassAfter},
		{ID: "t-5", Type: "a", Scenario: Healthy, Class: ClassAfter},
		{ID: "t-6", Type: "a", Scenario: Hopeless, Class: ClassBroken},
		{ID: "t-7", Type: "b", Scenario: Flaky, Class: ClassControl},
	}
	out := map[string]outcome{
		"t-1": {status: "succeeded", resolved: true, ended: true, endRecords: 1, seconds: 1},
		"t-2": {status: "needs_human_review", ended: true, endRecords: 1, seconds: 2},
		"t-3": {status: "held", endRecords: 0},
		"t-4": {status: "cancelled", ended: true, endRecords: 1, seconds: 3},
		"t-5": {status: "missing"},
		"t-6": {status: "blocked", ended: true, endRecords: 1, seconds: 6},
		"t-7": {status: "gave_up", ended: true, endRecords: 1, seconds: 4},
	}
	led := map[string][]Call{
		"t-1": {{Status: 200, Kind: kindSuccess, TokensIn: 100, TokensOut: 10}},
		"t-6": {{Status: 200, Kind: kindFailure, TokensIn: 100, TokensOut: 10}, {Status: 200, Kind: kindFailure, TokensIn: 100, TokensOut: 10}},
		"t-7": {{Status: 503, Kind: kindTransient}},
	}
	f := figures(RunnerLoop, ModeSteady, tasks, out, led, nil)
	if f.Solvable != 6 || f.SolvableUnresolved != 4 {
		t.Errorf("solvable %d, unresolved %d; want 6 and 4 (human, held, missing, gave up)", f.Solvable, f.SolvableUnresolved)
	}
	after, broken, control := f.ByClass[ClassAfter], f.ByClass[ClassBroken], f.ByClass[ClassControl]
	if after.Tasks != 5 || after.Solvable != 5 || after.SolvableUnresolved != 3 || after.Resolved != 1 || after.Tokens != 110 {
		t.Errorf("after the fix: %+v", after)
	}
	if broken.Solvable != 0 || broken.SolvableUnresolved != 0 || broken.WastedTokens != 220 {
		t.Errorf("broken: %+v", broken)
	}
	if control.SolvableUnresolved != 1 {
		t.Errorf("control: %+v", control)
	}
	if got := float64(after.MeanSecondsToEnd); got != 2 { // t-1, t-2, t-4 ended: (1+2+3)/3
		t.Errorf("after the fix: mean seconds to end %v, want 2", got)
	}
	f.setWall(14e9)
	if f.SecondsPerTask != 2 {
		t.Errorf("seconds per task %v, want 2", f.SecondsPerTask)
	}

	cfg := Config{Workload: Workload{Shape: ShapeRegression}}
	c := compare(cfg.withDefaults(), tasks, f, f)
	var b strings.Builder
	if err := Summarize(cfg, []Comparison{c}).Report(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"workload regression:", "per class", "after_fix", "solvable tasks unresolved", "seconds per task"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "mix:") {
		t.Errorf("a fixed shape's report prints a mix:\n%s", b.String())
	}
}
