package trust

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// A View's window keeps exactly what Insert keeps, whatever order the
// outcomes arrive in and however often one arrives; slices handed out
// before an insert still show what they showed.
func TestWindowKeepsWhatInsertKeeps(t *testing.T) {
	base := time.Date(2026, 5, 18, 0, 0, 0, 0, time.UTC)
	for seed := range uint64(50) {
		r := rand.New(rand.NewPCG(seed, 1))
		w := &window{keys: map[string]struct{}{}}
		var want []Outcome
		const limit = 7
		for i := range 40 {
			n := i
			if r.IntN(4) == 0 { // late or repeated
				n = r.IntN(i + 1)
			}
			o := Outcome{Key: fmt.Sprintf("k%02d", n), Success: n%3 == 0, At: base.Add(time.Duration(n) * time.Second)}
			held := slices.Clone(w.outcomes)
			handed := w.outcomes[:len(w.outcomes):len(w.outcomes)]
			w.insert(o, limit)
			want, _ = Insert(want, o, limit)
			if !slices.Equal(w.outcomes, want) {
				t.Fatalf("seed %d step %d: window %v, want %v", seed, i, w.outcomes, want)
			}
			if !slices.Equal(handed, held) {
				t.Fatalf("seed %d step %d: a slice handed out changed: %v, was %v", seed, i, handed, held)
			}
			if len(w.keys) != len(w.outcomes) {
				t.Fatalf("seed %d step %d: %d keys for %d outcomes", seed, i, len(w.keys), len(w.outcomes))
			}
		}
	}
}
