package policy_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
)

const spec7 = `{
  "defaults": {"model": "gpt-4o-mini", "tool_wait": "2m"},
  "types": {
    "go_fix": {
      "max_retries": 5,
      "skip_budget": 2,
      "steps": [
        {"name": "plan",      "on_fail": {"retry": 2, "final": "fail"}},
        {"name": "implement", "on_fail": {"retry": 3, "goto": [{"step": "plan", "max": 2}]}},
        {"name": "validate",  "run": "command", "command": ["go", "vet", "./..."], "on_fail": {"retry": 0, "goto": [{"step": "implement", "max": 3}]}},
        {"name": "test",      "run": "command", "command": ["go", "test", "./..."], "timeout": "5m",
                              "on_fail": {"retry": 1, "goto": [{"step": "implement", "max": 3}, {"step": "plan"}]}}
      ]
    },
    "css_fix": {"model": "gpt-4o", "simulated_success_rate": 0.05, "threshold": 0.2, "tool_wait": "30s",
                "verifier": {"kind": "command", "command": ["./still-broken.sh"], "timeout": "10s"}}
  }
}`

func TestParseAndMerge(t *testing.T) {
	f, err := policy.Parse([]byte(spec7))
	if err != nil {
		t.Fatal(err)
	}
	g := f.For("go_fix")
	if len(g.Steps) != 4 || g.MaxRetries != 5 || g.Model != "gpt-4o-mini" || *g.Steps[2].OnFail.Retry != 0 {
		t.Fatalf("go_fix = %+v", g)
	}
	c := f.For("css_fix")
	if c.Model != "gpt-4o" || c.SuccessRate() != 0.05 || *c.Threshold != 0.2 || c.Verifier.Kind != policy.VerifierCommand || c.MaxRetries != policy.DefaultMaxRetries {
		t.Fatalf("css_fix = %+v", c)
	}
	if g.ToolWait != policy.Duration(2*time.Minute) || c.ToolWait != policy.Duration(30*time.Second) {
		t.Fatalf("tool_wait of go_fix %v and css_fix %v, want the default's 2m and its own 30s", g.ToolWait, c.ToolWait)
	}
	if !f.For("triage_fix").IsExempt() || f.For("css_fix").IsExempt() {
		t.Fatal("default exemptions wrong")
	}
	var nilFile *policy.File
	if d := nilFile.For("x"); d.MaxRetries != policy.DefaultMaxRetries || d.SuccessRate() != 1 || d.Verifier.Kind != policy.VerifierNone {
		t.Fatalf("defaults = %+v", d)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	bad := `{"types": {"x": {
	  "max_retries": -1, "threshold": 2, "executor": "magic", "tool_wait": "-1s", "callback_url": "ftp://h.example/",
	  "template": "<task>{{.Task.Subject</task>",
	  "verifier": {"kind": "carrier-pigeon"},
	  "tools": [{"name": "lookup"}],
	  "steps": [
	    {"name": "a", "run": "command"},
	    {"name": "a", "on_fail": {"goto": [{"step": "later"}], "final": "explode"}}
	  ]}}}`
	_, err := policy.Parse([]byte(bad))
	if err == nil {
		t.Fatal("accepted a bad policy")
	}
	for _, want := range []string{"max_retries", "tool_wait", "threshold", "unknown executor", "carrier-pigeon", "tool 1 needs a name and a subject",
		"a command step needs a command", `name "a" is used twice`, `goto "later" must name an earlier step`, "final must be fail or skip",
		"types.x: template does not parse", `types.x: callback_url must be an http or https URL, not "ftp"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if _, err := policy.Parse([]byte(`{"types": {"x": {"modle": "typo"}}}`)); err == nil || !strings.Contains(err.Error(), "modle") {
		t.Errorf("unknown field not reported: %v", err)
	}
	if _, err := policy.Parse([]byte(`{"types": {"x": {"command_timeout": 10}}}`)); err == nil {
		t.Error("a number accepted as a duration")
	}
}

// Every trust and ladder number is set globally ("defaults") and per type;
// a type's Scoring carries them, the defaults fill what neither sets.
func TestTrustAndLadderNumbersPerType(t *testing.T) {
	f, err := policy.Parse([]byte(`{
	  "defaults": {"trust_window": 20, "probe_after": 3, "refine_attempts": 1},
	  "types": {
	    "strict": {"trust_window": 5, "min_outcomes": 3, "overall_weight": 1, "recency_weight": 0, "decay": 0.5,
	               "pivot_attempts": 3, "recurring_failures": 2, "recurring_window": "24h", "previous_attempts": 2, "rung_canary": 2},
	    "blind": {"rung_canary": 0}
	  }}`))
	if err != nil {
		t.Fatal(err)
	}
	s := f.For("strict").Scoring(scoring.Policy{}).WithDefaults()
	if s.Window != 5 || s.MinOutcomes != 3 || s.ProbeAfter != 3 || s.OverallWeight != 1 || s.RecencyWeight != 0 || s.Decay != 0.5 || s.RungCanary != 2 {
		t.Errorf("strict scoring %+v", s)
	}
	o := f.For("other").Scoring(scoring.Policy{}).WithDefaults()
	if o.Window != 20 || o.MinOutcomes != scoring.DefaultMinOutcomes || o.ProbeAfter != 3 || o.OverallWeight != scoring.DefaultOverallWeight || o.Decay != scoring.DefaultDecay ||
		o.RungCanary != scoring.DefaultRungCanary {
		t.Errorf("other scoring %+v", o)
	}
	if b := f.For("blind").Scoring(scoring.Policy{}).WithDefaults(); b.RungCanary >= 0 {
		t.Errorf("rung_canary 0 leaves the rung places on: %d", b.RungCanary)
	}
	if st := f.For("strict"); st.RefineAttempts != 1 || st.PivotAttempts != 3 || st.RecurringFailures != 2 ||
		st.RecurringWindow != policy.Duration(24*time.Hour) || st.PreviousAttempts != 2 {
		t.Errorf("strict ladder numbers %+v", st)
	}
	_, err = policy.Parse([]byte(`{"types": {
	  "a": {"trust_window": 101, "decay": 0, "recurring_failures": 6, "previous_attempts": 9, "probe_after": -1},
	  "b": {"overall_weight": 0.7},
	  "c": {"trust_window": 5},
	  "d": {"rung_canary": -1}
	}}`))
	for _, want := range []string{"types.a: trust_window must be within [1, 100]", "types.a: decay must be within (0, 1]",
		"types.a: recurring_failures must be at most 5", "types.a: previous_attempts must be at most 5", "types.a: probe_after must not be negative",
		"types.b: overall_weight 0.7 + recency_weight 0.4 must be 1", "types.c: min_outcomes 10 exceeds trust_window 5", "types.d: rung_canary must not be negative"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

func TestLoadInlineReadsTemplateFiles(t *testing.T) {
	dir := t.TempDir()
	tmpl := filepath.Join(dir, "css.tmpl")
	if err := os.WriteFile(tmpl, []byte("Fix {{.Task.Subject}}"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(path, []byte(`{"types": {"a": {"model": "m1", "template_file": "`+tmpl+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := policy.LoadInline(path)
	if err != nil {
		t.Fatal(err)
	}
	if a := f.Types["a"]; a.Template != "Fix {{.Task.Subject}}" || a.TemplateFile != "" || a.Model != "m1" {
		t.Fatalf("not inlined: %+v", a)
	}
	if _, err := policy.LoadInline(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if err := os.WriteFile(path, []byte(`{"types": {"a": {"template_file": "`+filepath.Join(dir, "gone.tmpl")+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := policy.LoadInline(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing template file: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(spec7))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"types": {"x": {"steps": [{"name": "a", "on_fail": {"goto": [{"step": "a"}]}}]}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := policy.Parse(data)
		if err != nil {
			return
		}
		for name := range p.Types {
			_ = p.For(name) // never panics on anything Parse accepted
		}
		if p.Validate() != nil {
			t.Fatal("Parse accepted what Validate rejects")
		}
	})
}

// Unknown fields, at any depth, values of the wrong type and type names
// that are no task type are reported together with what Validate finds:
// one error, every problem.
func TestParseReportsUnknownFieldsWithEveryOtherProblem(t *testing.T) {
	bad := `{
	  "defualts": {},
	  "defaults": {"modle": "gpt-4o", "max_retries": -2},
	  "types": {
	    "css_fix": {"threshold": 3, "verifier": {"kind": "command", "comand": ["x"]},
	                "steps": [{"name": "a", "on_fail": {"retries": 2}}], "tools": [{"name": "t", "subject": "s", "parameters": {"anything": 1}}]},
	    "go_fix": {"model": "m", "steps": [{"name": "a", "on_fail": {"retry": "x"}}]},
	    "py_fix": {"max_retries": "five", "canary": "three", "model": "m", "prompt_budget": -1},
	    "Bad Type": {"model": "m"},
	    "fine": {"Model": "case-insensitive, as the decoder matches it"}
	  }
	}`
	_, err := policy.Parse([]byte(bad))
	if err == nil {
		t.Fatal("accepted a bad policy")
	}
	for _, want := range []string{
		`policy: unknown field "defualts"`,
		`defaults: unknown field "modle"`,
		"defaults: max_retries must not be negative",
		`types.css_fix.verifier: unknown field "comand"`,
		`types.css_fix.steps[0].on_fail: unknown field "retries"`,
		"types.css_fix: threshold must be within [0, 1]",
		"types.css_fix: command verifier needs a command",
		"types.py_fix: canary: a JSON string where an integer is expected",
		"types.py_fix: max_retries: a JSON string where an integer is expected",
		"types.py_fix: prompt_budget must not be negative",                              // checked though other fields did not decode
		"types.go_fix: steps.on_fail.retry: a JSON string where an integer is expected", // the whole path
		`types: "Bad Type" is not a task type name`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	for _, unwanted := range []string{"anything", "fine", "Go struct"} {
		if strings.Contains(err.Error(), unwanted) {
			t.Errorf("error mentions %q:\n%v", unwanted, err)
		}
	}
	// The same order every time: sorted by where.
	_, again := policy.Parse([]byte(bad))
	if again.Error() != err.Error() {
		t.Errorf("problems in another order:\n%v\n---\n%v", err, again)
	}

	if _, err := policy.Parse([]byte(`{"types": {"Bad Type": {}}}`)); err == nil || !strings.Contains(err.Error(), `"Bad Type" is not a task type name`) {
		t.Errorf("a type name with a space: %v", err)
	}
	for _, name := range []string{"css.fix", "CSS_fix", "", strings.Repeat("a", 65)} {
		if _, err := policy.Parse([]byte(`{"types": {"` + name + `": {}}}`)); err == nil {
			t.Errorf("type name %q accepted", name)
		}
	}
	if _, err := policy.Parse([]byte(`{"types": {"a-b_9": {}}}`)); err != nil {
		t.Errorf("a valid type name refused: %v", err)
	}
	// What the bucket refuses is reported with the rest too.
	_, err = policy.Decode([]byte(`{"types": {"a": {"template_file": "x.tmpl", "modle": "m"}}}`))
	if err == nil || !errors.Is(err, policy.ErrTemplateFile) || !strings.Contains(err.Error(), `unknown field "modle"`) {
		t.Errorf("Decode: %v", err)
	}
}

// A file whose top level has a value of the wrong type is refused in the
// file's terms: where, what was found, what was expected — not Go's names.
func TestParseTopLevelTypeErrors(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{"types": []}`, "policy: types: a JSON array where an object is expected"},
		{`{"defaults": 3}`, "defaults: a JSON number where an object is expected"},
		{`["a"]`, "policy: a JSON array where an object is expected"},
	} {
		_, err := policy.Parse([]byte(tc.doc))
		if err == nil || err.Error() != tc.want {
			t.Errorf("Parse(%s) = %v, want %q", tc.doc, err, tc.want)
		}
	}
}

// Every field a type leaves out takes the defaults' value: a field added to
// Type and forgotten in For fails here.
func TestForMergesEveryField(t *testing.T) {
	var d policy.Type
	v := reflect.ValueOf(&d).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString("x")
		case reflect.Int, reflect.Int64:
			f.SetInt(3)
		case reflect.Float64:
			f.SetFloat(0.5)
		case reflect.Pointer:
			f.Set(reflect.New(f.Type().Elem()))
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 1, 1))
		default:
			t.Fatalf("field %s of kind %s: teach this test to set it", v.Type().Field(i).Name, f.Kind())
		}
	}
	got := (&policy.File{Defaults: d}).For("some_type")
	g := reflect.ValueOf(got)
	for i := range v.NumField() {
		if v.Type().Field(i).Name == "TemplateFile" {
			continue // read into Template when the file is loaded
		}
		if !reflect.DeepEqual(g.Field(i).Interface(), v.Field(i).Interface()) {
			t.Errorf("field %s: For gives %v, the defaults hold %v", v.Type().Field(i).Name, g.Field(i).Interface(), v.Field(i).Interface())
		}
	}
}

// The defaults' exempt cannot take the built-in exemptions away:
// "defaults": {"exempt": false} is every other type's default already, and
// the self-repair types stay exempt; "defaults": {"exempt": true} exempts
// every type. Only a type's own "exempt": false gates a self-repair type.
func TestDefaultsExemptKeepsTheBuiltInExemptions(t *testing.T) {
	for _, tt := range []struct {
		name   string
		policy string
		exempt map[string]bool
	}{
		{"no setting", `{"types": {}}`, map[string]bool{"security_fix": true, "triage_fix": true, "service_restart": true, "css_fix": false}},
		{"defaults false", `{"defaults": {"exempt": false}}`, map[string]bool{"security_fix": true, "triage_fix": true, "service_restart": true, "css_fix": false}},
		{"defaults true", `{"defaults": {"exempt": true}}`, map[string]bool{"security_fix": true, "css_fix": true}},
		{"a type's own false", `{"defaults": {"exempt": true}, "types": {"security_fix": {"exempt": false}}}`, map[string]bool{"security_fix": false, "triage_fix": true, "css_fix": true}},
		{"a type's own true", `{"defaults": {"exempt": false}, "types": {"css_fix": {"exempt": true}}}`, map[string]bool{"security_fix": true, "css_fix": true, "go_fix": false}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, err := policy.Parse([]byte(tt.policy))
			if err != nil {
				t.Fatal(err)
			}
			for typ, want := range tt.exempt {
				if got := f.For(typ).IsExempt(); got != want {
					t.Errorf("%s exempt = %v, want %v", typ, got, want)
				}
			}
		})
	}
}

// A type is named by an entry under "types", even an empty or null one;
// the defaults and the built-in exemptions name none.
func TestNames(t *testing.T) {
	f, err := policy.Parse([]byte(`{"defaults": {"max_retries": 3}, "types": {"css_fix": {}, "bug_fix": null, "go_fix": {"max_retries": 2}}}`))
	if err != nil {
		t.Fatal(err)
	}
	src := policy.Static(f)
	for _, c := range []struct {
		taskType string
		want     bool
	}{
		{"css_fix", true}, {"bug_fix", true}, {"go_fix", true},
		{"triage_fix", false}, {"made_up", false}, {"", false},
	} {
		if got := src.Names(c.taskType); got != c.want {
			t.Errorf("Names(%q) = %v, want %v", c.taskType, got, c.want)
		}
	}
	if (*policy.File)(nil).Names("css_fix") || (*policy.Source)(nil).Names("css_fix") || policy.Static(nil).Names("css_fix") {
		t.Error("the built-in defaults name a type")
	}
}
