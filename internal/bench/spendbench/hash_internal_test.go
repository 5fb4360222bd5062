package spendbench

import (
	"fmt"
	"testing"
)

// The coin is fair and each toss of a ticket independent of the one before.
func TestHashCoin(t *testing.T) {
	heads, same := 0, 0
	const n = 4000
	for i := range n {
		ticket := fmt.Sprintf("sb-%04d", i)
		a, b := hash(ticket, 0)%2, hash(ticket, 1)%2
		if a == 0 {
			heads++
		}
		if a == b {
			same++
		}
	}
	for name, v := range map[string]int{"heads": heads, "equal consecutive tosses": same} {
		if v < n*45/100 || v > n*55/100 {
			t.Errorf("%s: %d of %d, want about half", name, v, n)
		}
	}
}
