// Command go submits a task to dispatchmesh with the Go client, waits for
// its outcome and prints it.
//
//	go run ./examples/go ['{"type":"css_fix","subject":"src/app.css"}']
//
// NATS_URL says where `dispatch up` listens (default nats://127.0.0.1:4222).
// As a user of deploy/ (the "client" user): NATS_USER, NATS_PASSWORD, and
// NATS_INBOX_PREFIX=_INBOX.client, the only inbox it may read.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/client"
)

func main() {
	task := client.Task{Type: "css_fix", Subject: "src/app.css", Payload: json.RawMessage(`{"issue":"button misaligned"}`)}
	if len(os.Args) > 1 {
		task = client.Task{}
		if err := json.Unmarshal([]byte(os.Args[1]), &task); err != nil {
			fail(err)
		}
	}
	opts := []nats.Option{nats.UserInfo(os.Getenv("NATS_USER"), os.Getenv("NATS_PASSWORD"))} // unset: no user
	if prefix := os.Getenv("NATS_INBOX_PREFIX"); prefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(prefix))
	}
	nc, err := nats.Connect(cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL), opts...)
	if err != nil {
		fail(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	sub, err := c.Submit(ctx, task) // an invalid task: a *client.Error listing its problems
	if err != nil {
		fail(err)
	}
	fmt.Printf("submitted %s, waiting\n", sub.ID)
	out, err := c.Wait(ctx, sub.ID) // returns once the task is terminal
	if err != nil {
		fail(err)
	}
	fmt.Printf("%s %s after %d attempt(s), $%.4f\n", out.ID, out.Status, out.Attempts, out.Cost)
	if out.Result != nil {
		fmt.Println("answer:", out.Result.Summary)
	}
	if out.Reason != "" {
		fmt.Println("reason:", out.Reason)
	}
	if out.Status != "succeeded" {
		os.Exit(1)
	}
}

func fail(err error) {
	var e *client.Error
	if errors.As(err, &e) {
		fmt.Fprintf(os.Stderr, "error %d: %s\n", e.Code, e.Message)
		for _, p := range e.Problems {
			fmt.Fprintf(os.Stderr, "  - %s\n", p)
		}
	} else {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(1)
}
