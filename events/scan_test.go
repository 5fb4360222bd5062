package events_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// nest is a payload of n arrays inside each other.
func nest(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }

// DecodeSubmit refuses what a later stage could not decode or would
// silently change, and reads the id of what it refuses.
func TestDecodeSubmitRefusesWhatLaterStagesCannotCarry(t *testing.T) {
	for _, c := range []struct {
		name    string
		data    string
		wantID  string   // the id read from a refused message
		wantErr []string // nil: accepted
	}{
		{name: "payload at the depth limit", data: `{"type":"a","subject":"s","payload":` + nest(events.MaxDepth-1) + `}`},
		{
			name: "payload one level too deep", data: `{"id":"d-1","type":"a","subject":"s","payload":` + nest(events.MaxDepth) + `}`,
			wantID: "d-1", wantErr: []string{"nested deeper than 64 levels (at byte", "later stages could not decode it"},
		},
		{
			// 9,999 levels pass Go's decoder (limit 10,000); the queued
			// event, two levels deeper, would not.
			name: "the 9,999 levels of issue 9", data: `{"id":"deep-9","type":"a","subject":"s","payload":` + nest(9999) + `}`,
			wantID: "deep-9", wantErr: []string{"nested deeper than 64 levels"},
		},
		{
			name: "id after the deep part is still read", data: `{"type":"a","subject":"s","payload":` + nest(20000) + `,"id":"late"}`,
			wantErr: []string{"nested deeper"},
		},
		{
			name: "oversized, the id read", data: `{"id":"big-1","type":"a","subject":"s","payload":"` + strings.Repeat("x", 600<<10) + `"}`,
			wantID: "big-1", wantErr: []string{"message is 614", "limit is 262144"},
		},
		{
			name: "oversized, id spelled ID", data: `{"ID":"big-2","type":"a","payload":"` + strings.Repeat("x", 300<<10) + `"}`,
			wantID: "big-2", wantErr: []string{"limit is 262144"},
		},
		{
			name: "oversized, invalid id", data: `{"id":"a.b","type":"a","payload":"` + strings.Repeat("x", 300<<10) + `"}`,
			wantErr: []string{"limit is 262144"},
		},
		{
			name: "malformed after the id", data: `{"id":"m-1","type":"a","subject":`,
			wantID: "m-1", wantErr: []string{"malformed JSON"},
		},
		{
			name: "wrong-typed field after the id", data: `{"id":"m-2","type":"a","subject":"s","max_retries":"3"}`,
			wantID: "m-2", wantErr: []string{`field "max_retries" must be int`},
		},
		{
			name: "invalid UTF-8 in subject", data: "{\"id\":\"u-1\",\"type\":\"a\",\"subject\":\"a\xffb\"}",
			wantID: "u-1", wantErr: []string{`"subject" is not valid UTF-8 (at byte 35)`},
		},
		{
			name: "invalid UTF-8 in id", data: "{\"id\":\"u\xc3\",\"type\":\"a\",\"subject\":\"s\"}",
			wantErr: []string{`"id" is not valid UTF-8`},
		},
		{
			name: "invalid UTF-8 in type", data: "{\"id\":\"u-3\",\"type\":\"\xe2\x82\",\"subject\":\"s\"}",
			wantID: "u-3", wantErr: []string{`"type" is not valid UTF-8`},
		},
		{
			name: "invalid UTF-8 in a metadata value", data: "{\"id\":\"u-4\",\"type\":\"a\",\"subject\":\"s\",\"metadata\":{\"k\":\"\xc0\xaf\"}}",
			wantID: "u-4", wantErr: []string{`"metadata" holds a string that is not valid UTF-8`},
		},
		{
			name: "invalid UTF-8 in a metadata key", data: "{\"id\":\"u-5\",\"type\":\"a\",\"subject\":\"s\",\"metadata\":{\"\xed\xa0\x80\":\"v\"}}",
			wantID: "u-5", wantErr: []string{`"metadata" holds a string that is not valid UTF-8`},
		},
		{
			name: "invalid UTF-8 deep in the payload", data: "{\"id\":\"u-6\",\"type\":\"a\",\"subject\":\"s\",\"payload\":{\"x\":[\"ok\",\"\xff\"]}}",
			wantID: "u-6", wantErr: []string{`"payload" holds a string that is not valid UTF-8`},
		},
		{
			name: "invalid UTF-8 in a field name", data: "{\"id\":\"u-7\",\"type\":\"a\",\"subject\":\"s\",\"\xff\":1}",
			wantID: "u-7", wantErr: []string{"a field name is not valid UTF-8", "unknown field"},
		},
		{
			name: "lone high surrogate escape", data: `{"id":"u-8","type":"a","subject":"a\ud800b"}`,
			wantID: "u-8", wantErr: []string{`"subject" is not valid UTF-8`},
		},
		{
			name: "lone low surrogate escape", data: `{"id":"u-9","type":"a","subject":"s","payload":"\udc00"}`,
			wantID: "u-9", wantErr: []string{`"payload" is not valid UTF-8`},
		},
		{
			name: "high surrogate before another escape", data: `{"type":"a","subject":"\ud800\u0041"}`,
			wantErr: []string{`"subject" is not valid UTF-8`},
		},
		{
			name: "the id of the message, not of trailing data", data: `{"id":"first","type":"a","subject":"s"} {"id":"second"}`,
			wantID: "first", wantErr: []string{"trailing data"},
		},
		{name: "a bare string that is not UTF-8", data: "\"\xff\"", wantErr: []string{"the message is not valid UTF-8 (at byte 1)"}},
		{name: "surrogate pair escaped", data: `{"type":"a","subject":"\ud83d\ude00 \u00e9 \\ud800"}`},
		{name: "U+FFFD written by the sender", data: `{"type":"a","subject":"\ufffd ` + "\uFFFD" + ` \uFFFD"}`},
		{name: "multi-byte UTF-8", data: `{"type":"a","subject":"s","metadata":{"ключ":"値 😀"}}`},
		{
			// 50,000 '<' are 50 KB as sent and 300 KB as the mesh encodes them.
			name: "grows past the limit when re-encoded", data: `{"id":"lt-1","type":"a","subject":"s","payload":"` + strings.Repeat("<", 50000) + `"}`,
			wantID: "lt-1", wantErr: []string{"the task is 300", "as the mesh encodes it", "limit is 262144"},
		},
		{
			name: "metadata that grows past the limit", data: `{"type":"a","subject":"s","metadata":{"k":"` + strings.Repeat("&", 50000) + `"}}`,
			wantErr: []string{"as the mesh encodes it"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := events.DecodeSubmit([]byte(c.data), "")
			if c.wantErr == nil {
				if err != nil {
					t.Fatalf("DecodeSubmit: %v", err)
				}
				return
			}
			var inv *events.InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("err = %v, want an *InvalidError", err)
			}
			for _, want := range c.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if got.ID != c.wantID {
				t.Errorf("id read = %q, want %q", got.ID, c.wantID)
			}
		})
	}
}

// What DecodeSubmit accepts, the events that carry the task can decode:
// a payload at the depth limit still decodes two levels deeper.
func TestAcceptedDepthDecodesInEvents(t *testing.T) {
	s, err := events.DecodeSubmit([]byte(`{"type":"a","subject":"s","payload":`+nest(events.MaxDepth-1)+`}`), "")
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(events.Queued{Base: events.Base{Task: s.Task("t-1", time.Now())}})
	if err != nil {
		t.Fatal(err)
	}
	var back events.Queued
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatalf("the queued event does not decode: %v", err)
	}
}

func TestDecodeSubmitFrom(t *testing.T) {
	body := []byte(`{"id":"b-1","type":"css_fix","subject":"s"}`)
	for _, c := range []struct {
		subject string
		wantErr []string
	}{
		{"dispatch.submit.css_fix", nil},
		{"dispatch.submit", []string{`published on "dispatch.submit", which names no task type: publish on dispatch.submit.<type>`}},
		{"dispatch.submit.css_fix.extra", []string{`does not match the subject's type "css_fix.extra"`}},
		{"dispatch.submit.*", []string{`does not match the subject's type "*"`}},
		{"dispatch.submit.>", []string{`does not match the subject's type ">"`}},
		{"dispatch.submit.sql_fix", []string{`does not match the subject's type "sql_fix"`}},
	} {
		s, err := events.DecodeSubmitFrom(c.subject, body)
		if c.wantErr == nil {
			if err != nil || s.Type != "css_fix" || s.ID != "b-1" {
				t.Errorf("%s: %+v, %v", c.subject, s, err)
			}
			continue
		}
		if !errors.Is(err, events.ErrInvalid) || s.ID != "b-1" {
			t.Errorf("%s: err = %v, id %q; want ErrInvalid and the id", c.subject, err, s.ID)
			continue
		}
		for _, want := range c.wantErr {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q does not say %q", c.subject, err, want)
			}
		}
	}
	// A type from the subject only: a wildcard or dotted token is no type.
	for _, subject := range []string{"dispatch.submit.*", "dispatch.submit.>", "dispatch.submit.a.b", "dispatch.submit"} {
		if _, err := events.DecodeSubmitFrom(subject, []byte(`{"subject":"s"}`)); !errors.Is(err, events.ErrInvalid) {
			t.Errorf("%s without a type field: err = %v", subject, err)
		}
	}
}

func TestParseSubmitSubject(t *testing.T) {
	for _, c := range []struct {
		subject, typ string
		ok           bool
	}{
		{"dispatch.submit.css_fix", "css_fix", true},
		{"dispatch.submit.a.b", "a.b", true},
		{"dispatch.submit", "", false},
		{"dispatch.submit.", "", false},
		{"dispatch.submitx", "", false},
		{"dispatch.task.t.queued", "", false},
	} {
		if typ, ok := events.ParseSubmitSubject(c.subject); typ != c.typ || ok != c.ok {
			t.Errorf("ParseSubmitSubject(%q) = %q, %v; want %q, %v", c.subject, typ, ok, c.typ, c.ok)
		}
	}
}

func FuzzDecodeSubmitFrom(f *testing.F) {
	for _, seed := range []struct{ subject, data string }{
		{"dispatch.submit.css_fix", `{"subject":"s"}`},
		{"dispatch.submit", `{"type":"css_fix","subject":"s"}`},
		{"dispatch.submit.*", `{"id":"x","subject":"s"}`},
		{"dispatch.submit.a", "{\"subject\":\"\xff\"}"},
		{"dispatch.submit.a", `{"subject":"s","payload":` + nest(70) + `}`},
		{"dispatch.submit.a", `{"subject":"\ud800"}`},
	} {
		f.Add(seed.subject, []byte(seed.data))
	}
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		s, err := events.DecodeSubmitFrom(subject, data)
		if s.ID != "" && !events.ValidID(s.ID) {
			t.Fatalf("returned id %q", s.ID)
		}
		if err != nil {
			var inv *events.InvalidError
			if !errors.As(err, &inv) || len(inv.Problems) == 0 {
				t.Fatalf("error %v is not an *InvalidError with problems", err)
			}
			return
		}
		if typ, ok := events.ParseSubmitSubject(subject); !ok || typ != s.Type || !events.ValidType(typ) {
			t.Fatalf("accepted type %q on subject %q", s.Type, subject)
		}
		if events.SubmitSubject(s.Type) != subject {
			t.Fatalf("accepted on %q, would be published on %q", subject, events.SubmitSubject(s.Type))
		}
	})
}
