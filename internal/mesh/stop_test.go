package mesh_test

import (
	"context"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
)

// A mesh stopped while its services are still starting stops cleanly: the
// cancel is not a failure.
func TestStopWhileStarting(t *testing.T) {
	for range 5 {
		srv := natstest.Start(t)
		nc, _ := srv.Connect(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- mesh.Run(ctx, mesh.Options{NC: nc, Provision: true, Log: quiet, Grace: time.Second})
		}()
		// Stop once the micro service answers: the routers may still be binding.
		deadline := time.Now().Add(patience)
		for {
			if _, err := nc.Request("$SRV.PING.dispatch", nil, time.Second); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the mesh never came up")
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("mesh stopped with %v", err)
		}
	}
}
