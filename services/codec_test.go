package services_test

import (
	"bytes"
	stdjson "encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// The services encode and decode events with the v1 API of
// github.com/go-json-experiment/json (Go's encoding/json/v2, which Go 1.27
// runs encoding/json on). The events are a contract other languages read:
// these tests hold that what the services write is byte for byte what
// encoding/json writes (but for the one difference below), and that they
// read a body as encoding/json reads it.

func codecEvents() []any {
	at := time.Date(2026, 11, 29, 1, 7, 59, 780504165, time.UTC)
	task := events.Task{ID: "t-1", Type: "css_fix", Subject: "src/<app>&\"x\".css",
		Payload: stdjson.RawMessage(`{"issue": "button  misaligned", "n":[1, 2.50,null], "é":"\u00e9 \u2028"}`), SubmittedAt: at}
	base := events.Base{Task: task, Run: events.Run{Pass: 2, Attempt: 3, Rung: events.RungPivot, Step: "execute"}, At: at, By: "gate@host"}
	sealed := &events.Sealed{Rev: 8, State: stdjson.RawMessage(`{"id":"t-1","status":"pending"}`), MAC: "oWE6ErZIb1wbDG9y"}
	return []any{
		events.Verified{Base: base, Verification: events.Verification{Verdict: events.VerdictSkipped, Verifier: "none"}, Sealed: sealed},
		events.Admitted{Base: base, Trust: events.TrustDecision{Score: 0.8125, Outcomes: 50, Threshold: 0.15, Reason: "trusted"}, Sealed: sealed},
		events.Held{Base: base, Hold: events.HoldTrust, Reason: "waiting <its> turn", Sealed: nil},
		events.Verified{},
		events.TaskState{ID: "t-1", Type: "css_fix", Status: events.StatusRunning, Pass: 2, Attempts: 1, Cost: 0.000125, CreatedAt: at, UpdatedAt: at},
		// Text from outside (a command's stderr) may hold invalid UTF-8.
		events.TaskState{ID: "t-2", Status: events.StatusFailed, Reason: "exit 1: \xff\xfe cut\xe2\x82"},
	}
}

// replacement is the one difference between the two encoders: a string
// holding invalid UTF-8 is written with U+FFFD in its place, which
// encoding/json escapes (\ufffd) and json/v2 writes as the character.
// Decoded, both are the same text.
var replacement = strings.NewReplacer(`\ufffd`, "\uFFFD")

func TestEmitWritesWhatEncodingJSONWrites(t *testing.T) {
	for _, v := range codecEvents() {
		out, err := services.Emit("dispatch.task.t-1.verified", "t-1:2:verified", "task.verified.v1", "t-1", v)
		if err != nil {
			t.Fatal(err)
		}
		want, err := stdjson.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Data, []byte(replacement.Replace(string(want)))) {
			t.Errorf("%T:\n got %s\nwant %s", v, out.Data, want)
		}
	}
}

// FuzzDecodeReadsWhatEncodingJSONReads decodes any body as the stage events
// both ways: each accepts what the other accepts and reads the same event.
func FuzzDecodeReadsWhatEncodingJSONReads(f *testing.F) {
	for _, v := range codecEvents() {
		data, _ := stdjson.Marshal(v)
		f.Add(data)
	}
	for _, s := range []string{`{}`, `null`, `{"task":{"ID":"x","TYPE":"y"}}`, `{"run":{"pass":1,"pass":2}}`,
		`{"task":{"payload":{"a":"\ud800"}}}`, `{"at":"2026-11-29T01:07:59Z"}`, `{"at":"yesterday"}`, "{\"by\":\"\xff\"}",
		`{"run":{"pass":1.5}}`, `{"run":{"pass":"1"}}`, `{"sealed":{"rev":-1}}`, `[1]`, `{"task":{"payload":nul}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, mk := range []func() any{
			func() any { return new(events.Verified) },
			func() any { return new(events.Admitted) },
			func() any { return new(events.Held) },
			func() any { return new(events.TaskState) },
		} {
			got, want := mk(), mk()
			err := services.Decode(&services.Msg{Subject: "dispatch.task.x.verified", Data: data}, got)
			wantErr := stdjson.Unmarshal(data, want)
			if (err == nil) != (wantErr == nil) {
				t.Fatalf("%T %q: decode error %v, encoding/json's %v", got, data, err, wantErr)
			}
			if err == nil && !reflect.DeepEqual(got, want) {
				t.Fatalf("%T %q:\n got %+v\nwant %+v", got, data, got, want)
			}
		}
	})
}
