package trust_test

import (
	"fmt"
	"strings"

	"github.com/dispatchmesh/dispatchmesh/trust"
)

func ExamplePolicy_Evaluate() {
	var p trust.Policy // the SPEC defaults
	st := trust.Stats{Type: "css_fix", Outcomes: seq("FFFFFSFFFFFF")}
	v := p.Evaluate("css_fix", st)
	fmt.Println(v.Below, v.Reason)

	st.Outcomes = seq(strings.Repeat("F", 9))
	fmt.Println(p.Evaluate("css_fix", st).Below, "(too few outcomes to judge)")
	// Output:
	// true Blocked: css_fix trust score 0.08 below 0.15
	// false (too few outcomes to judge)
}
