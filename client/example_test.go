package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/client"
)

// Submit a task, wait for its outcome and print the final answer.
func Example() {
	nc, err := nats.Connect(meshURL) // e.g. nats://127.0.0.1:4222, as `dispatch up` prints
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	sub, err := c.Submit(ctx, client.Task{
		ID: "example-1", Type: "css_fix", Subject: "src/app.css",
		Payload: json.RawMessage(`{"issue": "button misaligned"}`),
	})
	if err != nil {
		panic(err)
	}
	out, err := c.Wait(ctx, sub.ID)
	if err != nil {
		panic(err)
	}
	fmt.Println(out.ID, out.Status, "after", out.Attempts, "attempt")
	fmt.Println(out.Result.Summary)
	// Output:
	// example-1 succeeded after 1 attempt
	// SIMULATED: no model was called; this attempt is reported as succeeded.
}

// An invalid task is refused with every problem, before anything is sent.
func ExampleClient_Submit_invalid() {
	nc, err := nats.Connect(meshURL)
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	c, _ := client.New(nc)

	_, err = c.Submit(context.Background(), client.Task{Type: "css_fix", MaxRetries: -1})
	var e *client.Error
	if errors.As(err, &e) && errors.Is(err, client.ErrInvalid) {
		for _, p := range e.Problems {
			fmt.Println(p)
		}
	}
	// Output:
	// "subject" is required
	// "max_retries" must not be negative
}
