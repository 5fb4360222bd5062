package events

import (
	"encoding/json"
	"slices"
	"testing"
)

// Two submissions of one id are the same task when their fields are,
// normalised: white space, key order and left-out fields (as their zero)
// do not count; numbers count as written.
func TestSubmitDifferences(t *testing.T) {
	base := Submit{ID: "a", Type: "css_fix", Subject: "s", Payload: json.RawMessage(`{"x":[1,{"y":"z"}],"n":1}`), Metadata: map[string]string{"k": "v"}}
	for _, c := range []struct {
		name string
		edit func(*Submit)
		want []string
	}{
		{"identical", func(*Submit) {}, nil},
		{"reordered and spaced", func(s *Submit) { s.Payload = json.RawMessage(` { "n": 1, "x": [ 1, {"y": "z"} ] } `) }, nil},
		{"empty metadata is none", func(s *Submit) { s.Metadata = map[string]string{"k": "v"} }, nil},
		{"deep payload", func(s *Submit) { s.Payload = json.RawMessage(`{"x":[1,{"y":"w"}],"n":1}`) }, []string{`"payload" differs at .x[1].y`}},
		{"number as written", func(s *Submit) { s.Payload = json.RawMessage(`{"x":[1,{"y":"z"}],"n":1.0}`) }, []string{`"payload" differs at .n`}},
		{"payload left out", func(s *Submit) { s.Payload = nil }, []string{`"payload" differs`}},
		{"extra key", func(s *Submit) { s.Payload = json.RawMessage(`{"x":[1,{"y":"z"}],"n":1,"m":2}`) }, []string{`"payload" differs at .m`}},
		{"type and metadata", func(s *Submit) { s.Type = "docs"; s.Metadata = map[string]string{"k": "w", "j": "1"} },
			[]string{`"type" differs: the task has "css_fix", this submission "docs"`, `"metadata" differs at "j", "k"`}},
		{"priority", func(s *Submit) { s.Priority = 3 }, []string{`"priority" differs: the task has 0, this submission 3`}},
		{"callback url", func(s *Submit) { s.CallbackURL = "https://h.example/x" }, []string{`"callback_url" differs: the task has "", this submission "https://h.example/x"`}},
	} {
		other := base
		c.edit(&other)
		if got := base.Differences(other); !slices.Equal(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if got := (Submit{Payload: json.RawMessage(`null`)}).Differences(Submit{}); got != nil {
		t.Errorf("null payload and none: %q, want the same", got)
	}
}
