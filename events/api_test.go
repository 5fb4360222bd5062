package events_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dispatchmesh/dispatchmesh/events"
)

func TestDecodeTaskRequest(t *testing.T) {
	for _, c := range []struct {
		name, data string
		id         string
		timeout    time.Duration
		problem    string // a substring of the error; "" when valid
	}{
		{"bare id", "fix-42", "fix-42", events.DefaultWaitTimeout, ""},
		{"bare id with a newline", "fix-42\n", "fix-42", events.DefaultWaitTimeout, ""},
		{"JSON string", `"fix-42"`, "fix-42", events.DefaultWaitTimeout, ""},
		{"object", `{"id":"fix-42"}`, "fix-42", events.DefaultWaitTimeout, ""},
		{"object with timeout", ` {"id":"fix-42","timeout":"90s"} `, "fix-42", 90 * time.Second, ""},
		{"longest timeout", `{"id":"a","timeout":"10m"}`, "a", events.MaxWaitTimeout, ""},

		{"empty", "", "", 0, "a task id is required"},
		{"blank", " \n", "", 0, "a task id is required"},
		{"id with a dot", "a.b", "", 0, `"id" "a.b" must be`},
		{"id with a wildcard", `{"id":"*"}`, "", 0, `"id" "*" must be`},
		{"id too long", strings.Repeat("i", events.MaxIDLen+1), "", 0, `must be 1-128 characters`},
		{"id missing", `{"timeout":"1s"}`, "", 0, `"id" "" must be`},
		{"id not a string", `{"id":42}`, "", 0, `field "id" must be string`},
		{"unknown field", `{"id":"a","wait":true}`, "", 0, `unknown field "wait"`},
		{"trailing data", `{"id":"a"} {}`, "", 0, "trailing data"},
		{"not JSON", `{"id":`, "", 0, "malformed JSON"},
		{"timeout not a duration", `{"id":"a","timeout":"soon"}`, "", 0, `"timeout" "soon" is not a duration`},
		{"timeout a number", `{"id":"a","timeout":30}`, "", 0, `field "timeout" must be string`},
		{"timeout too long", `{"id":"a","timeout":"11m"}`, "", 0, `must be more than 0 and at most 10m0s`},
		{"timeout zero", `{"id":"a","timeout":"0s"}`, "", 0, `must be more than 0`},
		{"two problems", `{"id":"a.b","timeout":"-1s"}`, "", 0, `"id" "a.b" must be 1-128 characters of A-Z, a-z, 0-9, _ or -; "timeout" -1s`},
		{"too big", `{"id":"` + strings.Repeat("a", events.MaxRequestBytes) + `"}`, "", 0, "limit is 4096"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := events.DecodeTaskRequest([]byte(c.data))
			if c.problem == "" {
				if err != nil || r.ID != c.id || r.WaitTimeout() != c.timeout {
					t.Fatalf("got %+v (timeout %s), %v; want id %q timeout %s", r, r.WaitTimeout(), err, c.id, c.timeout)
				}
				return
			}
			var ae *events.APIError
			if !errors.As(err, &ae) || ae.Code != events.CodeBadRequest || len(ae.Problems) == 0 {
				t.Fatalf("error %v is not a 400 *APIError with problems", err)
			}
			if !strings.Contains(ae.Message, c.problem) {
				t.Fatalf("message %q does not say %q", ae.Message, c.problem)
			}
		})
	}
}

// An error answer always has a problems array, never null: clients in
// other languages may iterate over it without a check.
func TestErrorReplyShape(t *testing.T) {
	b, err := json.Marshal(events.ErrorReply{Error: events.NewAPIError(events.CodeNotFound, "task x not found")})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"error":{"code":404,"message":"task x not found","problems":[]}}`; string(b) != want {
		t.Fatalf("got %s, want %s", b, want)
	}
}

func TestNewWaitReply(t *testing.T) {
	st := events.TaskState{ID: "t", Type: "a", Subject: "s", Status: events.StatusBlocked, Attempts: 7, Reason: "attempts exhausted", Cost: 0.5}
	r := events.NewWaitReply(st)
	if !r.Terminal || r.Status != events.StatusBlocked || r.Attempts != 7 || r.Reason != st.Reason || r.Cost != 0.5 {
		t.Fatalf("got %+v", r)
	}
	st.Status = events.StatusParked
	if events.NewWaitReply(st).Terminal {
		t.Fatal("parked is not terminal")
	}
}

// FuzzDecodeTaskRequest: any input is either a valid request or a 400
// *APIError whose message fits on one line (it travels in a header).
func FuzzDecodeTaskRequest(f *testing.F) {
	for _, seed := range []string{
		"fix-42", "fix-42\r\n", `"fix-42"`, `{"id":"fix-42"}`, `{"id":"a","timeout":"90s"}`, `{"id":"a","timeout":"1h"}`,
		`{"id":"a.b"}`, `{"id":"a","x":1}`, `{"id":"a"} {}`, `{"id":`, "", "a\nb", `{"id":"\u00e9"}`, "\xff\xfe", `null`, `[]`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := events.DecodeTaskRequest(data)
		if err != nil {
			var ae *events.APIError
			if !errors.As(err, &ae) || ae.Code != events.CodeBadRequest || len(ae.Problems) == 0 || ae.Problems == nil {
				t.Fatalf("error %#v is not a 400 *APIError with problems", err)
			}
			if strings.ContainsAny(ae.Message, "\r\n") {
				t.Fatalf("message %q spans lines", ae.Message)
			}
			if !utf8.ValidString(ae.Message) && utf8.Valid(data) {
				t.Fatalf("message %q is not UTF-8", ae.Message)
			}
			return
		}
		if !events.ValidID(r.ID) {
			t.Fatalf("accepted an invalid id %q", r.ID)
		}
		if d := r.WaitTimeout(); d <= 0 || d > events.MaxWaitTimeout {
			t.Fatalf("accepted timeout %q = %s", r.Timeout, d)
		}
		// What is accepted is accepted again in the canonical form.
		b, _ := json.Marshal(r)
		if r2, err := events.DecodeTaskRequest(b); err != nil || r2 != r {
			t.Fatalf("%s: decoded %+v, %v; want %+v", b, r2, err, r)
		}
	})
}
