package events_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dispatchmesh/dispatchmesh/events"
)

func TestDecodeSubmit(t *testing.T) {
	// big is a valid submission of exactly n bytes, its payload a long string.
	big := func(n int) (data string, payload json.RawMessage) {
		head := `{"type":"a","subject":"s","payload":`
		payload = json.RawMessage(`"` + strings.Repeat("x", n-len(head)-3) + `"`)
		return head + string(payload) + "}", payload
	}
	oversized, _ := big(events.MaxSubmitBytes + 1)
	atLimit, atLimitPayload := big(events.MaxSubmitBytes)
	for _, c := range []struct {
		name        string
		data        string
		subjectType string
		want        events.Submit
		wantErr     []string // each must appear in the error; nil: no error
	}{
		{
			name: "minimal",
			data: `{"type":"css_fix","subject":"src/app.css"}`,
			want: events.Submit{Type: "css_fix", Subject: "src/app.css"},
		},
		{
			name: "full",
			data: `{"id":"T_42-a","type":"css_fix","subject":"src/app.css","payload":{"a":1},` +
				`"max_retries":3,"priority":-2,"metadata":{"team":"web"}}`,
			subjectType: "css_fix",
			want: events.Submit{
				ID: "T_42-a", Type: "css_fix", Subject: "src/app.css", Payload: json.RawMessage(`{"a":1}`),
				MaxRetries: 3, Priority: -2, Metadata: map[string]string{"team": "web"},
			},
		},
		{
			name:        "type taken from subject",
			data:        `{"subject":"src/app.css"}`,
			subjectType: "css_fix",
			want:        events.Submit{Type: "css_fix", Subject: "src/app.css"},
		},
		{
			name:        "type mismatch with subject",
			data:        `{"type":"css_fix","subject":"s"}`,
			subjectType: "sql_fix",
			wantErr:     []string{`"type" "css_fix" does not match the subject's type "sql_fix"`},
		},
		{name: "missing type", data: `{"subject":"s"}`, wantErr: []string{`"type" is required`}},
		{name: "empty type", data: `{"type":"","subject":"s"}`, wantErr: []string{`"type" is required`}},
		{name: "type upper case", data: `{"type":"CSS","subject":"s"}`, wantErr: []string{`"type" "CSS" must be`}},
		{name: "type with dot", data: `{"type":"css.fix","subject":"s"}`, wantErr: []string{`"type" "css.fix" must be`}},
		{name: "type with wildcard", data: `{"type":">","subject":"s"}`, wantErr: []string{`"type" ">" must be`}},
		{
			name:    "type too long",
			data:    `{"type":"` + strings.Repeat("t", events.MaxTypeLen+1) + `","subject":"s"}`,
			wantErr: []string{`"type"`, "must be 1-64 characters"},
		},
		{
			name:        "bad type from subject",
			data:        `{"subject":"s"}`,
			subjectType: "Bad Type",
			wantErr:     []string{`"type" "Bad Type" must be`},
		},
		{name: "id with dot", data: `{"id":"a.b","type":"a","subject":"s"}`, wantErr: []string{`"id" "a.b" must be`}},
		{name: "id with space", data: `{"id":"a b","type":"a","subject":"s"}`, wantErr: []string{`"id" "a b" must be`}},
		{
			name:    "id too long",
			data:    `{"id":"` + strings.Repeat("i", events.MaxIDLen+1) + `","type":"a","subject":"s"}`,
			wantErr: []string{`"id"`, "must be 1-128 characters"},
		},
		{
			name: "id at limit",
			data: `{"id":"` + strings.Repeat("i", events.MaxIDLen) + `","type":"a","subject":"s"}`,
			want: events.Submit{ID: strings.Repeat("i", events.MaxIDLen), Type: "a", Subject: "s"},
		},
		{name: "missing subject", data: `{"type":"a"}`, wantErr: []string{`"subject" is required`}},
		{
			name:    "subject too long",
			data:    `{"type":"a","subject":"` + strings.Repeat("s", events.MaxSubjectLen+1) + `"}`,
			wantErr: []string{`"subject" is 1025 characters, limit is 1024`},
		},
		{
			name:    "wrong-typed field",
			data:    `{"type":"a","subject":"s","max_retries":"3"}`,
			wantErr: []string{`malformed JSON`, `field "max_retries" must be int, got string`},
		},
		{
			name:    "wrong-typed metadata value",
			data:    `{"type":"a","subject":"s","metadata":{"n":1}}`,
			wantErr: []string{`field "metadata`, `must be string, got number`},
		},
		{name: "unknown field", data: `{"type":"a","subject":"s","colour":"red"}`, wantErr: []string{`unknown field "colour"`}},
		{name: "trailing data", data: `{"type":"a","subject":"s"} {}`, wantErr: []string{"trailing data"}},
		{name: "trailing garbage", data: `{"type":"a","subject":"s"}x`, wantErr: []string{"malformed JSON"}},
		{name: "trailing brace", data: `{"type":"a","subject":"s"}}`, wantErr: []string{"malformed JSON"}},
		{name: "trailing bracket", data: `{"type":"a","subject":"s"}]`, wantErr: []string{"malformed JSON"}},
		{
			name: "trailing whitespace",
			data: "{\"type\":\"a\",\"subject\":\"s\"}\r\n\t ",
			want: events.Submit{Type: "a", Subject: "s"},
		},
		{name: "negative max_retries", data: `{"type":"a","subject":"s","max_retries":-1}`, wantErr: []string{`"max_retries" must not be negative`}},
		{
			name:    "too much metadata",
			data:    `{"type":"a","subject":"s","metadata":` + metadataJSON(events.MaxMetadataPairs+1) + `}`,
			wantErr: []string{`"metadata" has 33 entries, limit is 32`},
		},
		{name: "empty message", data: ``, wantErr: []string{"malformed JSON"}},
		{name: "not JSON", data: `type=a`, wantErr: []string{"malformed JSON"}},
		{name: "truncated", data: `{"type":"a","subject":`, wantErr: []string{"malformed JSON"}},
		{name: "array", data: `[{"type":"a","subject":"s"}]`, wantErr: []string{"malformed JSON"}},
		{name: "null", data: `null`, wantErr: []string{`"type" is required`, `"subject" is required`}},
		{name: "broken payload", data: `{"type":"a","subject":"s","payload":{x}}`, wantErr: []string{"malformed JSON"}},
		{
			name:    "every problem at once",
			data:    `{"id":"a.b","type":"A","subject":"","max_retries":-1}`,
			wantErr: []string{`"type" "A"`, `"id" "a.b"`, `"subject" is required`, `"max_retries" must not be negative`},
		},
		{
			name:    "oversized",
			data:    oversized,
			wantErr: []string{"message is 262145 bytes, limit is 262144"},
		},
		{
			name: "at size limit",
			data: atLimit,
			want: events.Submit{Type: "a", Subject: "s", Payload: atLimitPayload},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := events.DecodeSubmit([]byte(c.data), c.subjectType)
			if c.wantErr == nil {
				if err != nil {
					t.Fatalf("DecodeSubmit: %v", err)
				}
				if !reflect.DeepEqual(got, c.want) {
					t.Errorf("DecodeSubmit = %+v, want %+v", got, c.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("DecodeSubmit = %+v, want an error", got)
			}
			if !errors.Is(err, events.ErrInvalid) {
				t.Errorf("errors.Is(%v, ErrInvalid) = false", err)
			}
			var inv *events.InvalidError
			if !errors.As(err, &inv) || len(inv.Problems) == 0 {
				t.Errorf("error %v is not an *InvalidError with problems", err)
			}
			for _, want := range c.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
}

func metadataJSON(n int) string {
	m := make(map[string]string, n)
	for i := range n {
		m[strings.Repeat("k", i+1)] = "v"
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// TestDecodeSubmitKeepsPayloadVerbatim: payload is free JSON of any kind and
// reaches the prompt template byte for byte, whitespace and escapes included.
func TestDecodeSubmitKeepsPayloadVerbatim(t *testing.T) {
	for _, payload := range []string{
		`{"selector": ".btn",  "sizes": [ 1, 2 ]}`,
		`[1, "two", null, {"x": {}}]`,
		`"a \u00e9 \"quoted\" <tag>"`,
		`-1.5e-300`,
		`12345678901234567890123`,
		`true`,
		`false`,
		`null`,
		`{}`,
		"{\n\t\"multi\": \"line\"\n}",
	} {
		data := []byte(`{"type":"a","subject":"s","payload":` + payload + `}`)
		s, err := events.DecodeSubmit(data, "")
		if err != nil {
			t.Errorf("payload %s: %v", payload, err)
			continue
		}
		if !bytes.Equal(s.Payload, []byte(payload)) {
			t.Errorf("payload %s came back as %s", payload, s.Payload)
		}
		if task := s.Task("id", time.Now()); !bytes.Equal(task.Payload, []byte(payload)) {
			t.Errorf("payload %s: task payload is %s", payload, task.Payload)
		}
	}
	s, err := events.DecodeSubmit([]byte(`{"type":"a","subject":"s"}`), "")
	if err != nil || s.Payload != nil {
		t.Errorf("absent payload: got %q, %v; want nil", s.Payload, err)
	}
}

func TestInvalidErrorMessage(t *testing.T) {
	for _, c := range []struct {
		problems []string
		want     string
	}{
		{nil, "invalid task"},
		{[]string{"a"}, "invalid task: a"},
		{[]string{"a", "b", "c"}, "invalid task: a; b; c"},
	} {
		err := &events.InvalidError{Problems: c.problems}
		if err.Error() != c.want {
			t.Errorf("Error() = %q, want %q", err.Error(), c.want)
		}
		if !errors.Is(err, events.ErrInvalid) {
			t.Error("errors.Is(InvalidError, ErrInvalid) = false")
		}
	}
	if errors.Is(errors.New("invalid task"), events.ErrInvalid) {
		t.Error("ErrInvalid must match by identity, not by message")
	}
}

func TestSubmitTask(t *testing.T) {
	at := time.Date(2026, 5, 18, 16, 22, 0, 0, time.FixedZone("CEST", 2*3600))
	s := events.Submit{
		Type: "css_fix", Subject: "src/app.css", Payload: json.RawMessage(`{}`),
		MaxRetries: 3, Priority: 1, Metadata: map[string]string{"k": "v"},
	}
	task := s.Task("generated", at)
	want := events.Task{
		ID: "generated", Type: "css_fix", Subject: "src/app.css", Payload: json.RawMessage(`{}`),
		MaxRetries: 3, Priority: 1, Metadata: map[string]string{"k": "v"}, SubmittedAt: at.UTC(),
	}
	if !reflect.DeepEqual(task, want) {
		t.Errorf("Task = %+v, want %+v", task, want)
	}
	if task.SubmittedAt.Location() != time.UTC {
		t.Errorf("SubmittedAt is in %v, want UTC", task.SubmittedAt.Location())
	}
	s.ID = "client-id"
	if got := s.Task("generated", at).ID; got != "client-id" {
		t.Errorf("client-supplied id: Task().ID = %q", got)
	}
}

func TestValidIDAndType(t *testing.T) {
	for _, c := range []struct {
		s          string
		id, typeOK bool
	}{
		{"css_fix", true, true},
		{"a-b_c-9", true, true},
		{"T-42", true, false},
		{"", false, false},
		{"a.b", false, false},
		{"a b", false, false},
		{"*", false, false},
		{">", false, false},
		{"é", false, false},
		{strings.Repeat("a", events.MaxTypeLen), true, true},
		{strings.Repeat("a", events.MaxTypeLen+1), true, false},
		{strings.Repeat("a", events.MaxIDLen), true, false},
		{strings.Repeat("a", events.MaxIDLen+1), false, false},
	} {
		if got := events.ValidID(c.s); got != c.id {
			t.Errorf("ValidID(%q) = %v, want %v", c.s, got, c.id)
		}
		if got := events.ValidType(c.s); got != c.typeOK {
			t.Errorf("ValidType(%q) = %v, want %v", c.s, got, c.typeOK)
		}
	}
}

func FuzzDecodeSubmit(f *testing.F) {
	for _, seed := range []struct{ data, subjectType string }{
		{`{"type":"css_fix","subject":"src/app.css"}`, ""},
		{`{"subject":"src/app.css"}`, "css_fix"},
		{`{"id":"t-1","type":"a","subject":"s","payload":{"x":[1,2]},"max_retries":3,"priority":1,"metadata":{"k":"v"}}`, "a"},
		{`{"type":"a","subject":"s","max_retries":"3"}`, ""},
		{`{"type":"a","subject":"s","payload":null} `, ""},
		{`{"type":"a","subject":"s"} {}`, ""},
		{`{"id":"a.b","type":"A","subject":""}`, "b"},
		{`{"type":"a","subject":"s","metadata":{}}`, ""},
		{`null`, "x"},
		{``, ""},
		{`{"type":"a","subject":"s","payload":[[[[[[[[[[]]]]]]]]]]}`, ""},
		{"{\"type\":\"a\",\"subject\":\"\xff\"}", ""},
		{`{"type":"a","subject":"\ud800"}`, ""},
		{`{"type":"a","subject":"s","payload":"<<<<&&&>>>"}`, ""},
	} {
		f.Add([]byte(seed.data), seed.subjectType)
	}
	f.Fuzz(func(t *testing.T, data []byte, subjectType string) {
		s, err := events.DecodeSubmit(data, subjectType)
		if err != nil {
			if !errors.Is(err, events.ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			var inv *events.InvalidError
			if !errors.As(err, &inv) || len(inv.Problems) == 0 {
				t.Fatalf("error %v is not an *InvalidError with problems", err)
			}
			return
		}
		if len(data) > events.MaxSubmitBytes {
			t.Fatalf("accepted %d bytes", len(data))
		}
		if !json.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		if !events.ValidType(s.Type) {
			t.Fatalf("accepted type %q", s.Type)
		}
		if subjectType != "" && s.Type != subjectType {
			t.Fatalf("type %q differs from the subject's %q", s.Type, subjectType)
		}
		if s.ID != "" && !events.ValidID(s.ID) {
			t.Fatalf("accepted id %q", s.ID)
		}
		if s.Subject == "" || len(s.Subject) > events.MaxSubjectLen {
			t.Fatalf("accepted subject of %d bytes", len(s.Subject))
		}
		if s.MaxRetries < 0 || len(s.Metadata) > events.MaxMetadataPairs {
			t.Fatalf("accepted max_retries %d, %d metadata pairs", s.MaxRetries, len(s.Metadata))
		}
		if len(s.Payload) > 0 && !json.Valid(s.Payload) {
			t.Fatalf("accepted payload %q", s.Payload)
		}
		if !utf8.Valid(data) {
			t.Fatalf("accepted invalid UTF-8 %q", data)
		}
		// Every later stage decodes the events that carry what intake accepted.
		queued, err := json.Marshal(events.Queued{Base: events.Base{Task: s.Task("t-1", time.Unix(0, 0))}})
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(queued, new(events.Queued)); err != nil {
			t.Fatalf("the queued event of %q does not decode: %v", data, err)
		}
		if len(queued) > events.MaxSubmitBytes+1024 {
			t.Fatalf("accepted a task whose queued event is %d bytes", len(queued))
		}

		// What intake accepted, re-encoded, is accepted again and means the same.
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(s); err != nil {
			t.Fatalf("encoding %+v: %v", s, err)
		}
		if buf.Len() > events.MaxSubmitBytes {
			return
		}
		again, err := events.DecodeSubmit(buf.Bytes(), s.Type)
		if err != nil {
			t.Fatalf("re-encoded %s is rejected: %v", buf.Bytes(), err)
		}
		if !sameSubmit(s, again) {
			t.Fatalf("round trip changed %+v into %+v", s, again)
		}
	})
}

// sameSubmit compares submissions as JSON: payload by value, an empty
// metadata map like an absent one (omitempty drops it).
func sameSubmit(a, b events.Submit) bool {
	if !jsonEqual(a.Payload, b.Payload) || len(a.Metadata) != len(b.Metadata) {
		return false
	}
	for k, v := range a.Metadata {
		if w, ok := b.Metadata[k]; !ok || v != w {
			return false
		}
	}
	a.Payload, b.Payload, a.Metadata, b.Metadata = nil, nil, nil, nil
	return reflect.DeepEqual(a, b)
}

func jsonEqual(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	decode := func(raw []byte) (any, error) {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		err := dec.Decode(&v)
		return v, err
	}
	av, aerr := decode(a)
	bv, berr := decode(b)
	return aerr == nil && berr == nil && reflect.DeepEqual(av, bv)
}
