package review_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// BenchmarkLiveLoad100k: how long the live feed takes to load 100,000
// task states into its search index (the watch of the task bucket, each
// state read back by revision), then one search over them through
// Client.Tasks. The states are written once, before the timer.
func BenchmarkLiveLoad100k(b *testing.B) {
	const n = 100_000
	srv := natstest.Start(b)
	st, err := services.Provision(bg, srv.JS, services.StreamConfig{})
	if err != nil {
		b.Fatal(err)
	}
	at := time.Now().UTC()
	var acks []jetstream.PubAckFuture
	for i := range n {
		id := fmt.Sprintf("t-%06d", i)
		data, _ := json.Marshal(events.TaskState{ID: id, Type: "css_fix", Subject: fmt.Sprintf("src/f%d.css", i), Status: events.StatusSucceeded,
			Reason: "on attempt 1", CreatedAt: at.Add(time.Duration(i) * time.Millisecond)})
		ack, err := srv.JS.PublishAsync("$KV."+services.BucketTasks+"."+id, data)
		if err != nil {
			b.Fatal(err)
		}
		acks = append(acks, ack)
		if len(acks) == 1000 {
			for _, a := range acks {
				<-a.Ok()
			}
			acks = acks[:0]
		}
	}
	for _, a := range acks {
		<-a.Ok()
	}
	_ = st
	for b.Loop() {
		rc, err := review.New(review.Config{JS: srv.JS, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		p, err := rc.Tasks(bg, review.TaskQuery{Text: "t-09999", Limit: 50})
		if err != nil || len(p.Tasks) != 10 || p.Scanned != n {
			b.Fatalf("%d rows of %d scanned, %v", len(p.Tasks), p.Scanned, err)
		}
		rc.Close()
	}
}
