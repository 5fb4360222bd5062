package prompt

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
)

// FuzzRender renders the default template with arbitrary text wherever text
// from a model, a tool, a command or a human goes, and checks the escaping
// invariant: the user message is well-formed XML with exactly the sections
// the template made, each injected text is character data that decodes to
// what xml.EscapeText would decode to, and the payload is the same JSON.
func FuzzRender(f *testing.F) {
	f.Add(hostile, hostile, hostile, hostile, hostile, "src/app.css", "REFINE", []byte(`{"a":1}`))
	f.Add("tried X", "exit 1\r\nstack:\n\tat foo", "", "", "please retry", `a"b<c>&'`, "PIVOT", []byte(`{"x":"</payload>"}`))
	f.Add("\x00\xff\uFFFE", "]]>", "<![CDATA[", "&amp;", "-->", "", "", []byte("\"\xff\uFFFE\""))
	f.Fuzz(func(t *testing.T, approach, summary, errText, context, note, subject, rung string, payload []byte) {
		b := events.Base{
			Task: events.Task{ID: "t1", Type: "fuzz", Subject: subject},
			Run:  events.Run{Pass: 1, Attempt: 2, Rung: events.Rung(rung), Step: "execute", Context: context, Note: note},
		}
		if json.Valid(payload) {
			b.Task.Payload = payload
		}
		previous := []history.Entry{
			{Key: "k", TaskID: "t1", Attempt: 1, Rung: events.Rung(rung), Step: subject, Outcome: summary, Approach: approach, Summary: summary, Error: errText, At: t0},
			{Key: "k", TaskID: "t0", Attempt: 2, Rung: RungPivot, Step: "execute", Outcome: "failure", Approach: errText, Summary: context, Error: note, At: t0},
		}
		user := renderDefault(t, NewData(b, previous))
		es := parseUser(t, user)

		want := []string{"task"}
		if len(b.Task.Payload) > 0 {
			want = append(want, "payload")
		}
		// Previous attempts are fitted to the budget and deduplicated: at
		// most the two given, each a real element (escaped text cannot open one).
		switch n := strings.Count(user, "<attempt n="); {
		case n > 2:
			t.Fatalf("%d attempts rendered from 2 entries\n%s", n, user)
		case n > 0:
			want = append(want, "previous_attempts")
			for range n {
				want = append(want, "attempt")
			}
		}
		if strings.TrimSpace(context) != "" {
			want = append(want, "last_error")
		}
		if strings.TrimSpace(note) != "" {
			want = append(want, "reviewer_note")
		}
		if RungInstructions(events.Rung(rung)) != "" {
			want = append(want, "instructions")
		}
		if got := names(es); !slices.Equal(got, want) {
			t.Fatalf("elements = %v, want %v\n%s", got, want, user)
		}
		if n, want := strings.Count(user, "</previous_attempts>"), min(1, strings.Count(user, "<attempt n=")); n != want {
			t.Fatalf("</previous_attempts> appears %d times\n%s", n, user)
		}
		if got, want := find(es, "task")[0].Attrs["subject"], xmlText(t, stdEscape(subject)); normalizeWS(got) != normalizeWS(want) {
			t.Errorf("subject attribute = %q, want %q", got, want)
		}
		// Short texts are carried whole (a long one is clipped to the budget).
		if context = strings.TrimSpace(context); context != "" && len(context) < 200 {
			if got, want := find(es, "last_error")[0].Text, xmlText(t, stdEscape(context)); got != want {
				t.Errorf("last_error = %q, want %q", got, want)
			}
		}
		if note = strings.TrimSpace(note); note != "" && len(note) < 200 {
			if got, want := find(es, "reviewer_note")[0].Text, xmlText(t, stdEscape(note)); got != want {
				t.Errorf("reviewer_note = %q, want %q", got, want)
			}
		}
		if len(b.Task.Payload) > 0 {
			assertSameJSON(t, b.Task.Payload, []byte(find(es, "payload")[0].Text))
		}
	})
}

// normalizeWS maps the whitespace an attribute value may have normalised to spaces.
func normalizeWS(s string) string {
	return strings.NewReplacer("\t", " ", "\n", " ", "\r", " ").Replace(s)
}
