package mesh_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"dispatchmesh/events"
	"dispatchmesh/services/intake"
)

// The synchronous submit endpoint answers the task id or the validation
// error, keeps bad input for review, and makes one task of one id.
func TestSubmitAPI(t *testing.T) {
	e := newEnv(t, succeed, nil)
	e.start()
	// The endpoint registers once the stores are open: wait until it answers pings.
	deadline := time.Now().Add(patience)
	for {
		if _, err := e.srv.NC.Request("$SRV.PING.dispatch", nil, time.Second); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("micro service never came up: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ask := func(body string) (intake.SubmitReply, string) {
		t.Helper()
		msg, err := e.srv.NC.Request(events.SubmitAPI, []byte(body), patience)
		if err != nil {
			t.Fatalf("request: %v", err)
		}
		if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
			return intake.SubmitReply{}, code + " " + msg.Header.Get(micro.ErrorHeader)
		}
		var r intake.SubmitReply
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			t.Fatalf("reply %q: %v", msg.Data, err)
		}
		return r, ""
	}

	r, problem := ask(`{"type":"css_fix","subject":"src/app.css"}`)
	if problem != "" || !events.ValidID(r.ID) || r.Duplicate {
		t.Fatalf("valid submit: %+v %s", r, problem)
	}
	if got := last(e.waitEnd(r.ID)).Stage; got != events.StageSucceeded {
		t.Fatalf("ended with %s", got)
	}
	if r2, _ := ask(`{"id":"` + r.ID + `","type":"css_fix","subject":"src/app.css"}`); r2.ID != r.ID || !r2.Duplicate {
		t.Fatalf("same id again: %+v", r2)
	}

	_, problem = ask(`{"type":"css_fix","subject":"a.css","max_retries":"lots"}`)
	if !strings.HasPrefix(problem, "400 ") || !strings.Contains(problem, "max_retries") {
		t.Fatalf("wrong-typed field answered %q", problem)
	}
	_, problem = ask(`not json`)
	if !strings.HasPrefix(problem, "400 ") || !strings.Contains(problem, "malformed JSON") {
		t.Fatalf("malformed input answered %q", problem)
	}
	kept := e.waitReviews(events.ReviewRejected, 2)
	if string(kept[1].Data) != "not json" && string(kept[0].Data) != "not json" {
		t.Fatal("rejected input not kept with its original bytes")
	}

	// status over request-reply, for clients in any language
	msg, err := e.srv.NC.Request(intake.StatusAPI, []byte(r.ID), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var st events.TaskState
	if err := json.Unmarshal(msg.Data, &st); err != nil || st.Status != events.StatusSucceeded {
		t.Fatalf("status reply %s: %v", msg.Data, err)
	}
}
