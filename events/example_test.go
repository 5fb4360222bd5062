package events_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

func ExampleDecodeSubmit() {
	// A client published this on dispatch.submit.css_fix; the type comes from the subject.
	msg := []byte(`{"id":"t-42","subject":"src/app.css","payload":{"selector":".btn"}}`)
	s, err := events.DecodeSubmit(msg, "css_fix")
	if err != nil {
		fmt.Println(err)
		return
	}
	task := s.Task("generated-id", time.Date(2026, 5, 18, 14, 22, 0, 0, time.UTC))
	fmt.Println(task.ID, task.Type, task.Subject, string(task.Payload))
	fmt.Println(events.TaskSubject(task.ID, events.StageQueued))
	// Output:
	// t-42 css_fix src/app.css {"selector":".btn"}
	// dispatch.task.t-42.queued
}

func ExampleDecodeSubmit_invalid() {
	_, err := events.DecodeSubmit([]byte(`{"subject":"src/app.css","max_retries":"3"}`), "css_fix")
	fmt.Println(err)
	fmt.Println(errors.Is(err, events.ErrInvalid))

	_, err = events.DecodeSubmit([]byte(`{"id":"a.b","type":"CSS","subject":""}`), "")
	fmt.Println(err)
	// Output:
	// invalid task: malformed JSON: field "max_retries" must be int, got string
	// true
	// invalid task: "type" "CSS" must be 1-64 characters of a-z, 0-9, _ or -; "id" "a.b" must be 1-128 characters of A-Z, a-z, 0-9, _ or -; "subject" is required
}
