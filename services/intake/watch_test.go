package intake

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// A watch sends a task's events in order — its own, not another task's —
// each naming where it is stored, from after the sequence asked; then an
// end message once its span is over, so the client asks again from there.
func TestWatchSendsTheTasksEventsFromWhereAsked(t *testing.T) {
	ctx := context.Background()
	srv, _, a := newAPI(t)
	if _, err := a.Start(srv.NC, "0.0.1"); err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	publish := func(subject string) uint64 {
		m := nats.NewMsg(subject)
		m.Data = []byte(`{}`)
		m.Header.Set(events.HeaderEvent, "test.v1")
		ack, err := srv.JS.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	queued := publish(events.TaskSubject("w1", events.StageQueued))
	publish(events.TaskSubject("other", events.StageQueued))
	verified := publish(events.TaskSubject("w1", events.StageVerified))
	gated := publish(events.ReviewSubject(events.ReviewGated, "w1"))

	watch := func(after uint64) (seqs []uint64, subjects []string, ended bool) {
		inbox := srv.NC.NewInbox()
		sub, err := srv.NC.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		req := `{"id":"w1","timeout":"1s","after":` + strconv.FormatUint(after, 10) + `}`
		if err := srv.NC.PublishRequest(events.APIWatch, inbox, []byte(req)); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := sub.NextMsg(30 * time.Second)
			if err != nil {
				t.Fatalf("watch after %d: %v (so far %v)", after, err, subjects)
			}
			if m.Header.Get(events.HeaderWatchEnd) != "" {
				return seqs, subjects, true
			}
			seq, err := strconv.ParseUint(m.Header.Get(events.HeaderWatchSeq), 10, 64)
			if err != nil || m.Header.Get(events.HeaderEvent) != "test.v1" || m.Header.Get(events.HeaderWatchTime) == "" {
				t.Fatalf("a watch message without its headers: %v", m.Header)
			}
			seqs, subjects = append(seqs, seq), append(subjects, m.Header.Get(events.HeaderWatchSubject))
		}
	}
	seqs, subjects, ended := watch(0)
	if len(seqs) != 3 || seqs[0] != queued || seqs[1] != verified || seqs[2] != gated || !ended {
		t.Fatalf("watch from the start: %v %v ended=%v; want w1's three events, then the end", seqs, subjects, ended)
	}
	if seqs, _, _ := watch(verified); len(seqs) != 1 || seqs[0] != gated {
		t.Fatalf("watch after %d: %v, want only %d", verified, seqs, gated)
	}
}
