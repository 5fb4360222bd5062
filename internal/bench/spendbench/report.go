package spendbench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// Stat is a figure over several runs.
type Stat struct {
	Median Ratio `json:"median"`
	Min    Ratio `json:"min"`
	Max    Ratio `json:"max"`
}

// stat summarizes values, ignoring undefined ones.
func stat(values []float64) Stat {
	var v []float64
	for _, x := range values {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		nan := Ratio(math.NaN())
		return Stat{nan, nan, nan}
	}
	slices.Sort(v)
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return Stat{Ratio(med), Ratio(v[0]), Ratio(v[len(v)-1])}
}

// Row is one figure of a mode's summary: the mesh's, the loop's, and mesh /
// loop of their medians.
type Row struct {
	Name  string `json:"name"`
	Mesh  Stat   `json:"mesh"`
	Loop  Stat   `json:"loop"`
	Ratio Ratio  `json:"ratio"`
	// MeshOnly rows have no loop figure.
	MeshOnly bool `json:"mesh_only,omitempty"`
	digits   int
}

// ScenarioRow is one scenario's figures (medians) in a mode's summary.
type ScenarioRow struct {
	Scenario string `json:"scenario"`
	Rows     []Row  `json:"rows"`
}

// ModeSummary is every run of one delivery mode.
type ModeSummary struct {
	Mode string `json:"mode"`
	Runs int    `json:"runs"`
	Rows []Row  `json:"rows"`
	// Checks are comparison figures: ratios of each run, and counts of
	// tasks the mesh should have resolved.
	Checks     []Row           `json:"checks"`
	Statuses   map[string]Stat `json:"mesh_statuses"`
	Rungs      map[string]Stat `json:"mesh_prompt_tokens_per_call_by_rung"`
	ByScenario []ScenarioRow   `json:"by_scenario"`
	// ByClass are the figures per report class, when the workload has
	// classes.
	ByClass []ScenarioRow `json:"by_class,omitempty"`
}

// Summary is the result of a benchmark: a summary per delivery mode, and
// every run.
type Summary struct {
	// Workload is the shape's name, Shape its description.
	Workload      string        `json:"workload"`
	Shape         string        `json:"shape"`
	Tasks         int           `json:"tasks"`
	ContextTokens int           `json:"context_tokens"`
	Rate          float64       `json:"steady_rate"`
	LatencyMS     int64         `json:"latency_ms"`
	Mix           []Share       `json:"mix,omitempty"`
	Modes         []ModeSummary `json:"modes"`
	Runs          []Comparison  `json:"runs"`
}

type figure struct {
	name     string
	get      func(Figures) float64
	meshOnly bool
	digits   int
	// ratio: the class table shows mesh / loop too.
	ratio bool
}

var figureRows = []figure{
	{name: "tasks", get: func(f Figures) float64 { return float64(f.Tasks) }},
	{name: "resolved", get: func(f Figures) float64 { return float64(f.Resolved) }},
	{name: "tokens", get: func(f Figures) float64 { return float64(f.Tokens) }},
	{name: "tokens per resolved", get: func(f Figures) float64 { return float64(f.TokensPerResolved) }},
	{name: "wasted tokens", get: func(f Figures) float64 { return float64(f.WastedTokens) }},
	{name: "solvable tasks", get: func(f Figures) float64 { return float64(f.Solvable) }},
	{name: "solvable tasks unresolved (human, held, gave up)", get: func(f Figures) float64 { return float64(f.SolvableUnresolved) }},
	{name: "model calls", get: func(f Figures) float64 { return float64(f.Calls) }},
	{name: "transient answers", get: func(f Figures) float64 { return float64(f.TransientCalls) }},
	{name: "attempts (non-transient calls)", get: func(f Figures) float64 { return float64(f.Attempts) }},
	{name: "retries", get: func(f Figures) float64 { return float64(f.Retries) }},
	{name: "retry successes", get: func(f Figures) float64 { return float64(f.RetrySuccesses) }},
	{name: "retry success rate", get: func(f Figures) float64 { return float64(f.RetrySuccessRate) }, digits: 3},
	{name: "identical requests after a deterministic error", get: func(f Figures) float64 { return float64(f.IdenticalAfterDeterministic) }},
	{name: "calls after auth or quota failure", get: func(f Figures) float64 { return float64(f.CallsAfterAuthOrQuota) }},
	{name: "transient errors counted as attempts", get: func(f Figures) float64 { return float64(f.TransientCountedAsAttempts) }, meshOnly: true},
	{name: "server attempts the mesh did not count", get: func(f Figures) float64 { return float64(f.UncountedAttempts) }, meshOnly: true},
	{name: "requests refused (not sent)", get: func(f Figures) float64 { return float64(f.Refused) }, meshOnly: true},
	{name: "tokens in the mesh's task states", get: func(f Figures) float64 { return float64(f.MeshTokens) }, meshOnly: true},
	{name: "tasks not ended", get: func(f Figures) float64 { return float64(f.NotEnded) }},
	{name: "tasks held (settled, not ended)", get: func(f Figures) float64 { return float64(f.Held) }},
	{name: "tasks without exactly one end record", get: func(f Figures) float64 { return float64(f.BadEndRecords) }},
	{name: "success answers not resolved", get: func(f Figures) float64 { return float64(f.SuccessNotResolved) }},
	{name: "wall time (s)", get: func(f Figures) float64 { return f.WallSeconds }, digits: 1},
	{name: "seconds per task (wall / tasks)", get: func(f Figures) float64 { return float64(f.SecondsPerTask) }, digits: 3},
	{name: "mean seconds from submission to end", get: func(f Figures) float64 { return float64(f.MeanSecondsToEnd) }, digits: 2},
}

type check struct {
	name   string
	get    func(Comparison) float64
	digits int
}

var checkRows = []check{
	{name: "tokens per resolved, mesh / loop", get: func(c Comparison) float64 { return float64(c.TokensPerResolved) }, digits: 3},
	{name: "wasted tokens, mesh / loop", get: func(c Comparison) float64 { return float64(c.WastedTokens) }, digits: 3},
	{name: "tasks the loop resolved and the mesh did not", get: func(c Comparison) float64 { return float64(c.LoopResolvedMeshNot) }},
	{name: "fixable + history + pivot tasks the mesh left unresolved", get: func(c Comparison) float64 { return float64(c.CarryOverUnresolved) }},
	{name: "resolvable tasks the mesh left unresolved", get: func(c Comparison) float64 { return float64(c.ResolvableUnresolved) }},
}

var scenarioRows = []figure{
	{name: "tasks", get: func(f Figures) float64 { return float64(f.Tasks) }},
	{name: "resolved", get: func(f Figures) float64 { return float64(f.Resolved) }},
	{name: "tokens", get: func(f Figures) float64 { return float64(f.Tokens) }},
	{name: "tokens/resolved", get: func(f Figures) float64 { return float64(f.TokensPerResolved) }},
	{name: "wasted", get: func(f Figures) float64 { return float64(f.WastedTokens) }},
	{name: "calls", get: func(f Figures) float64 { return float64(f.Calls) }},
	{name: "retries", get: func(f Figures) float64 { return float64(f.Retries) }},
	{name: "retry ok", get: func(f Figures) float64 { return float64(f.RetrySuccessRate) }, digits: 2},
}

var classRows = []figure{
	{name: "tasks", get: func(f Figures) float64 { return float64(f.Tasks) }},
	{name: "resolved", get: func(f Figures) float64 { return float64(f.Resolved) }},
	{name: "solvable", get: func(f Figures) float64 { return float64(f.Solvable) }},
	{name: "solvable unresolved", get: func(f Figures) float64 { return float64(f.SolvableUnresolved) }},
	{name: "tokens", get: func(f Figures) float64 { return float64(f.Tokens) }, ratio: true},
	{name: "tokens/resolved", get: func(f Figures) float64 { return float64(f.TokensPerResolved) }, ratio: true},
	{name: "wasted", get: func(f Figures) float64 { return float64(f.WastedTokens) }, ratio: true},
	{name: "s to end", get: func(f Figures) float64 { return float64(f.MeanSecondsToEnd) }, digits: 1},
}

// Summarize folds runs (any modes, any number of each) into a summary per
// mode, in the order the modes first appear.
func Summarize(cfg Config, runs []Comparison) Summary {
	cfg = cfg.withDefaults()
	shape, _ := LookupShape(cfg.Workload.Shape)
	s := Summary{
		Workload: cfg.Workload.Shape, Shape: shape.Description,
		Tasks: cfg.Workload.Tasks, ContextTokens: max(cfg.Workload.ContextTokens, 0), Rate: cfg.Rate,
		LatencyMS: cfg.Latency.Milliseconds(), Runs: runs,
	}
	if !shape.Fixed {
		s.Mix = cfg.Workload.Mix
	}
	var modes []string
	byMode := map[string][]Comparison{}
	for _, c := range runs {
		if _, ok := byMode[c.Mode]; !ok {
			modes = append(modes, c.Mode)
		}
		byMode[c.Mode] = append(byMode[c.Mode], c)
	}
	for _, m := range modes {
		s.Modes = append(s.Modes, summarizeMode(m, byMode[m]))
	}
	return s
}

func summarizeMode(mode string, cs []Comparison) ModeSummary {
	ms := ModeSummary{Mode: mode, Runs: len(cs), Statuses: map[string]Stat{}, Rungs: map[string]Stat{}}
	pick := func(get func(Figures) float64, side func(Comparison) Figures) Stat {
		v := make([]float64, len(cs))
		for i, c := range cs {
			v[i] = get(side(c))
		}
		return stat(v)
	}
	mesh := func(c Comparison) Figures { return c.Mesh }
	loop := func(c Comparison) Figures { return c.Loop }
	row := func(fg figure, m, l func(Comparison) Figures) Row {
		r := Row{Name: fg.name, Mesh: pick(fg.get, m), MeshOnly: fg.meshOnly, digits: fg.digits}
		if fg.meshOnly {
			r.Loop = Stat{Ratio(math.NaN()), Ratio(math.NaN()), Ratio(math.NaN())}
			r.Ratio = Ratio(math.NaN())
		} else {
			r.Loop = pick(fg.get, l)
			r.Ratio = ratio(float64(r.Mesh.Median), float64(r.Loop.Median))
		}
		return r
	}
	for _, fg := range figureRows {
		ms.Rows = append(ms.Rows, row(fg, mesh, loop))
	}
	for _, ch := range checkRows {
		v := make([]float64, len(cs))
		for i, c := range cs {
			v[i] = ch.get(c)
		}
		ms.Checks = append(ms.Checks, Row{Name: ch.name, Mesh: stat(v), Loop: Stat{}, Ratio: Ratio(math.NaN()), MeshOnly: true, digits: ch.digits})
	}
	statuses, rungs := map[string]bool{}, map[string]bool{}
	for _, c := range cs {
		for k := range c.Mesh.Statuses {
			statuses[k] = true
		}
		for k := range c.Mesh.PromptTokensByRung {
			rungs[k] = true
		}
	}
	for k := range statuses {
		ms.Statuses[k] = pick(func(f Figures) float64 { return float64(f.Statuses[k]) }, mesh)
	}
	for k := range rungs {
		ms.Rungs[k] = pick(func(f Figures) float64 {
			if r, ok := f.PromptTokensByRung[k]; ok {
				return float64(r.PromptPerCall)
			}
			return math.NaN()
		}, mesh)
	}
	for _, sc := range scenarioNames(cs) {
		side := func(get func(Comparison) Figures) func(Comparison) Figures {
			return func(c Comparison) Figures {
				f := get(c)
				return Figures{Tally: f.ByScenario[sc]}
			}
		}
		sr := ScenarioRow{Scenario: sc}
		for _, fg := range scenarioRows {
			sr.Rows = append(sr.Rows, row(fg, side(mesh), side(loop)))
		}
		ms.ByScenario = append(ms.ByScenario, sr)
	}
	for _, cl := range classNames(cs) {
		side := func(get func(Comparison) Figures) func(Comparison) Figures {
			return func(c Comparison) Figures {
				f := get(c)
				return Figures{Tally: f.ByClass[cl]}
			}
		}
		cr := ScenarioRow{Scenario: cl}
		for _, fg := range classRows {
			cr.Rows = append(cr.Rows, row(fg, side(mesh), side(loop)))
		}
		ms.ByClass = append(ms.ByClass, cr)
	}
	return ms
}

// classNames are the classes present, in report order.
func classNames(cs []Comparison) []string {
	present := map[string]bool{}
	for _, c := range cs {
		for k := range c.Mesh.ByClass {
			present[k] = true
		}
	}
	return inOrder(present, Classes)
}

// scenarioNames are the scenarios present, in report order.
func scenarioNames(cs []Comparison) []string {
	present := map[string]bool{}
	for _, c := range cs {
		for k := range c.Mesh.ByScenario {
			present[k] = true
		}
	}
	return inOrder(present, Scenarios)
}

// inOrder lists the names present: those of order first, in its order,
// then the others sorted.
func inOrder(present map[string]bool, order []string) []string {
	var out []string
	for _, s := range order {
		if present[s] {
			out = append(out, s)
			delete(present, s)
		}
	}
	rest := make([]string, 0, len(present))
	for s := range present {
		rest = append(rest, s)
	}
	slices.Sort(rest)
	return append(out, rest...)
}

// WriteJSON writes the summary as indented JSON.
func (s Summary) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// Report writes the summary as tables: per mode, every figure of the mesh
// and the loop with mesh / loop, the checks, the mesh's end statuses and
// prompt tokens per call by rung, and the figures per scenario.
func (s Summary) Report(w io.Writer) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "spend benchmark: %d tasks, prompt context ≈%d tokens, model latency %d ms, steady rate %g tasks/s\n",
		s.Tasks, s.ContextTokens, s.LatencyMS, s.Rate)
	if s.Workload != "" && s.Workload != ShapeDefault {
		fmt.Fprintf(b, "workload %s: %s\n", s.Workload, s.Shape)
	}
	if len(s.Mix) > 0 {
		total := 0.0
		for _, m := range s.Mix {
			total += max(m.Percent, 0)
		}
		var mix []string
		for _, m := range s.Mix {
			// Shares are printed as percentages whatever they add up to
			// (BatchMix's are counts).
			mix = append(mix, fmt.Sprintf("%s %.3g%%", m.Scenario, 100*max(m.Percent, 0)/total))
		}
		fmt.Fprintf(b, "mix: %s\n", strings.Join(mix, ", "))
	}
	for _, m := range s.Modes {
		fmt.Fprintf(b, "\n== delivered %s: %d run(s); median (min–max) ==\n", modeLabel(m.Mode), m.Runs)
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "figure\tmesh\tloop\tmesh/loop\t")
		for _, r := range m.Rows {
			loop, rat := "", ""
			if !r.MeshOnly {
				loop, rat = r.Loop.format(r.digits), formatRatio(r.Ratio)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", r.Name, r.Mesh.format(r.digits), loop, rat)
		}
		for _, r := range m.Checks {
			fmt.Fprintf(tw, "%s\t%s\t\t\t\n", r.Name, r.Mesh.format(r.digits))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(b, "mesh end statuses:")
		for _, k := range slices.Sorted(maps.Keys(m.Statuses)) {
			fmt.Fprintf(b, " %s %s", k, m.Statuses[k].format(0))
		}
		fmt.Fprintln(b)
		if len(m.Rungs) > 0 {
			fmt.Fprintf(b, "mesh prompt tokens per call by rung:")
			for _, k := range slices.Sorted(maps.Keys(m.Rungs)) {
				fmt.Fprintf(b, " %s %s", orString(k, "(none)"), m.Rungs[k].format(0))
			}
			fmt.Fprintln(b)
		}
		if err := writeGroups(b, "\nper scenario (medians), mesh | loop:", "scenario", scenarioRows, m.ByScenario); err != nil {
			return err
		}
		if len(m.ByClass) > 0 {
			if err := writeGroups(b, "\nper class (medians), mesh | loop (mesh/loop):", "class", classRows, m.ByClass); err != nil {
				return err
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeGroups writes one table of groups (scenarios, classes): a row a
// group, a column a figure, each cell "mesh | loop" (the task count once),
// with the ratio where the figure asks for it.
func writeGroups(b *strings.Builder, title, kind string, figures []figure, groups []ScenarioRow) error {
	fmt.Fprintln(b, title)
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\t", kind)
	for _, fg := range figures {
		fmt.Fprintf(tw, "%s\t", fg.name)
	}
	fmt.Fprintln(tw)
	for _, g := range groups {
		fmt.Fprintf(tw, "%s\t", g.Scenario)
		for i, r := range g.Rows {
			if r.Name == "tasks" {
				fmt.Fprintf(tw, "%s\t", formatValue(float64(r.Mesh.Median), 0))
				continue
			}
			cell := fmt.Sprintf("%s | %s", formatValue(float64(r.Mesh.Median), r.digits), formatValue(float64(r.Loop.Median), r.digits))
			if figures[i].ratio {
				cell += " (" + formatRatio(r.Ratio) + ")"
			}
			fmt.Fprintf(tw, "%s\t", cell)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

func modeLabel(mode string) string {
	switch mode {
	case ModeOnce:
		return "all at once"
	case ModeSteady:
		return "at a steady rate"
	}
	return mode
}

func (s Stat) format(digits int) string {
	med := formatValue(float64(s.Median), digits)
	if !s.Min.Defined() || s.Min == s.Max {
		return med
	}
	return fmt.Sprintf("%s (%s–%s)", med, formatValue(float64(s.Min), digits), formatValue(float64(s.Max), digits))
}

func formatValue(v float64, digits int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	if digits == 0 && v != math.Trunc(v) {
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.*f", digits, v)
}

func formatRatio(r Ratio) string {
	if !r.Defined() {
		return "–"
	}
	return fmt.Sprintf("%.2f×", float64(r))
}
