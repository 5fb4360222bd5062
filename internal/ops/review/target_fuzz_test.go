package review

import (
	"errors"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// FuzzParseTarget: a ticked item (target=ID@N) and a search cursor come
// from a browser or a command line: either a valid value or ErrInvalid,
// never a crash, and a valid one reads back the same.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"t-1", "t-1@0", " t_2@3 ", "@", "a@b@c", "t@-1", "t@99999999999999999999", "1747576800000000000.t-1", ".", "x\x00@1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := ParseTarget(s)
		switch {
		case err != nil && !errors.Is(err, ErrInvalid):
			t.Fatalf("%q: %v, want ErrInvalid", s, err)
		case err == nil && (!events.ValidID(tg.ID) || tg.Seen < -1 || strings.Contains(tg.ID, "@")):
			t.Fatalf("%q read as %+v", s, tg)
		}
		at, id, err := parseSearchCursor(s)
		switch {
		case err != nil && !errors.Is(err, ErrInvalid):
			t.Fatalf("cursor %q: %v, want ErrInvalid", s, err)
		case err == nil:
			if back := searchCursor(TaskRow{SubmittedAt: at, ID: id}); back != s {
				t.Fatalf("cursor %q reads back as %q", s, back)
			}
		}
	})
}
