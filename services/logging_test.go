package services_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// records keeps every log record.
type records struct {
	mu   sync.Mutex
	list []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, rec.Clone())
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// One line per message, with where it came from, at the level of what
// becomes of it.
func TestLogging(t *testing.T) {
	x := errors.New("x")
	for _, c := range []struct {
		name  string
		err   error
		level slog.Level
		msg   string
		attrs map[string]string // besides subject, seq, delivered
	}{
		{name: "handled", level: slog.LevelDebug, msg: "handled", attrs: map[string]string{"outputs": "1"}},
		{name: "snoozed", err: &services.Fate{Action: services.ActionNak, Delay: time.Second, Result: services.ResultSnoozed, Err: x},
			level: slog.LevelDebug, msg: "snoozed", attrs: map[string]string{"action": "nak", "delay": "1s", "err": "x"}},
		{name: "retried", err: &services.Fate{Action: services.ActionNak, Delay: 2 * time.Second, Result: services.ResultRetried, Err: x},
			level: slog.LevelWarn, msg: "handler failed; retrying", attrs: map[string]string{"action": "nak", "delay": "2s", "err": "x"}},
		{name: "shutdown", err: &services.Fate{Action: services.ActionNak, Result: services.ResultShutdown, Err: x},
			level: slog.LevelInfo, msg: "shutdown: handing message back", attrs: map[string]string{"action": "nak", "delay": "0s", "err": "x"}},
		{name: "dead", err: &services.Fate{Action: services.ActionTerm, Reason: events.ReviewRejected, Result: services.ResultDead, Err: x},
			level: slog.LevelWarn, msg: "sent to review", attrs: map[string]string{"action": "term", "reason": "rejected", "err": "x"}},
		{name: "poison", err: &services.Fate{Action: services.ActionTerm, Reason: events.ReviewPoison, Result: services.ResultDead, Err: x},
			level: slog.LevelError, msg: "sent to review", attrs: map[string]string{"action": "term", "reason": "poison", "err": "x"}},
		{name: "dead-letter failed", err: &services.Fate{Action: services.ActionNak, Delay: time.Second, Result: services.ResultNone, Err: x},
			level: slog.LevelError, msg: "dead-letter failed; retrying later", attrs: map[string]string{"action": "nak", "delay": "1s", "err": "x"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var rec records
			h := services.Logging(slog.New(&rec))(func(context.Context, *services.Msg) ([]services.Out, error) {
				if c.err != nil {
					return nil, c.err
				}
				return []services.Out{{}}, nil
			})
			if _, err := h(context.Background(), &services.Msg{Subject: "dispatch.task.t1.in", Seq: 7, Delivered: 2}); err != c.err {
				t.Fatalf("error %v changed to %v", c.err, err)
			}
			if len(rec.list) != 1 {
				t.Fatalf("%d lines, want 1", len(rec.list))
			}
			r := rec.list[0]
			if r.Level != c.level || r.Message != c.msg {
				t.Errorf("%s %q, want %s %q", r.Level, r.Message, c.level, c.msg)
			}
			want := map[string]string{"subject": "dispatch.task.t1.in", "seq": "7", "delivered": "2"}
			for k, v := range c.attrs {
				want[k] = v
			}
			got := map[string]string{}
			r.Attrs(func(a slog.Attr) bool { got[a.Key] = a.Value.String(); return true })
			if len(got) != len(want) {
				t.Errorf("attrs %v, want %v", got, want)
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}
