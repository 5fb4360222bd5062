package verifier_test

import (
	"context"
	"fmt"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services/verifier"
)

// A command verifier exits 1 when the problem is gone: the task is stale.
func ExampleCommand() {
	c := &verifier.Command{Argv: []string{"sh", "-c", "echo fixed upstream; exit 1"}}
	v, err := c.Check(context.Background(), events.Task{ID: "t1", Type: "css_fix", Subject: "web/app.css"})
	fmt.Println(v.Verdict, v.Verifier, v.Detail, err)
	// Output: stale command fixed upstream <nil>
}
