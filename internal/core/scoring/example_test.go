package scoring_test

import (
	"fmt"
	"strings"

	"github.com/dispatchmesh/dispatchmesh/internal/core/scoring"
)

func ExamplePolicy_Evaluate() {
	var p scoring.Policy // the SPEC defaults
	st := scoring.Stats{Type: "css_fix", Outcomes: seq("FFFFFSFFFFFF")}
	v := p.Evaluate("css_fix", st)
	fmt.Println(v.Below, v.Reason)

	st.Outcomes = seq(strings.Repeat("F", 9))
	fmt.Println(p.Evaluate("css_fix", st).Below, "(too few outcomes to judge)")
	// Output:
	// true Blocked: css_fix trust score 0.08 below 0.15
	// false (too few outcomes to judge)
}
