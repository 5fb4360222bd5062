package recorder_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/recorder"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

var now = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func failed(class events.ErrorClass, why string) events.Result {
	return events.Result{Outcome: events.OutcomeFailure, Approach: "a", Error: why, ErrorClass: class, TokensIn: 10, TokensOut: 5, Cost: 0.01}
}

func ok() events.Result {
	return events.Result{Outcome: events.OutcomeSuccess, Approach: "b", Summary: "fixed", TokensIn: 10, TokensOut: 5}
}

// budgeted gives css_fix a daily budget no test reaches: the spend
// counters count what a budget caps, tokens and cost here.
var budgeted = &policy.File{Types: map[string]policy.Type{"css_fix": {DailyBudget: &policy.Budget{Tokens: 1 << 40, Cost: 1e6}}}}

// harness is a recorder on a fresh embedded JetStream, with the mesh's
// streams and buckets, that publishes what it returns as the router does.
type harness struct {
	t     *testing.T
	rec   *recorder.Service
	tasks *services.TaskStore
	hist  *history.Store
	view  *trust.View
	js    jetstream.JetStream
	nc    *nats.Conn
}

// recorderOn starts a recorder, its metrics on reg.
func recorderOn(t *testing.T, reg prometheus.Registerer) *harness {
	t.Helper()
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stores, err := services.Provision(ctx, srv.JS, services.StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, tasks: services.NewTaskStore(stores.Tasks), hist: history.NewStore(stores.History), js: srv.JS, nc: srv.NC}
	if h.view, err = trust.NewView(ctx, srv.JS, nil, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.view.Stop)
	h.rec, err = recorder.New(recorder.Config{
		Tasks: h.tasks, History: h.hist, Trust: h.view, CountSpend: true,
		Policy: policy.Static(budgeted), Registry: reg, Instance: "recorder@test",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// handle runs one message through the recorder and publishes its outputs
// with their Msg-Ids, as the router does; it returns the outputs.
func (h *harness) handle(m *services.Msg) []services.Out {
	h.t.Helper()
	outs, err := h.rec.Handle(context.Background(), m)
	if err != nil {
		h.t.Fatalf("Handle: %v", err)
	}
	for _, out := range outs {
		if _, err := h.js.PublishMsg(context.Background(), services.NatsMsg(out), jetstream.WithMsgID(out.MsgID)); err != nil {
			h.t.Fatalf("publish %s: %v", out.Subject, err)
		}
	}
	return outs
}

// moves are the outputs that move the task on or file it for review (a
// task event or a review record), leaving out what the attempt adds to
// the history, trust and spend.
func moves(outs []services.Out) []services.Out {
	var m []services.Out
	for _, o := range outs {
		if strings.HasPrefix(o.Subject, events.TaskRoot+".") || strings.HasPrefix(o.Subject, "dispatch.review.") {
			m = append(m, o)
		}
	}
	return m
}
