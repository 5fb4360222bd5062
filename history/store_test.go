package history_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"dispatchmesh/events"
	"dispatchmesh/history"
	"dispatchmesh/internal/natstest"
)

const subject = "src/app/handlers/response.go"

// newLog creates the history stream as the mesh provisions it and a Log
// reading it.
func newLog(t *testing.T) (*history.Log, *natstest.Server) {
	t.Helper()
	srv := natstest.Start(t)
	_, err := srv.JS.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: history.Stream, Subjects: []string{history.Filter},
		MaxMsgsPerSubject: history.Keep, Duplicates: time.Hour, AllowDirect: true,
	})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	l := history.NewLog(srv.NC)
	t.Cleanup(func() { _ = l.Close() })
	return l, srv
}

func record(t *testing.T, js jetstream.JetStream, taskType, subj string, e history.Entry) {
	t.Helper()
	msgs, err := history.Msgs(taskType, subj, e)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
}

func entry(i int, outcome string) history.Entry {
	return history.Entry{
		Key: fmt.Sprintf("t%d:1", i), TaskID: fmt.Sprintf("t%d", i), Attempt: 1,
		Outcome: outcome, At: at.Add(time.Duration(i) * time.Minute),
	}
}

func keys(entries []history.Entry) []string {
	var k []string
	for _, e := range entries {
		k = append(k, e.Key)
	}
	return k
}

func TestKey(t *testing.T) {
	k := history.Key("css_fix", subject)
	if !regexp.MustCompile(`^css_fix\.[0-9a-f]{32}$`).MatchString(k) {
		t.Errorf("Key = %q", k)
	}
	if history.Key("css_fix", subject+"x") == k || history.Key("js_fix", subject) == k {
		t.Error("keys collide")
	}
	if s := history.Subject("css_fix", subject, history.KindFailure); s != history.Root+"."+k+".failure" {
		t.Errorf("Subject = %q", s)
	}
}

func TestLogRecentAbsent(t *testing.T) {
	l, _ := newLog(t)
	rec, err := l.Recent(t.Context(), "css_fix", subject)
	if err != nil || len(rec.Outcomes) != 0 || len(rec.Failures) != 0 || rec.Type != "css_fix" || rec.Subject != subject {
		t.Fatalf("Recent = %+v, %v", rec, err)
	}
}

// Entries come back in time order whatever order they were recorded in;
// a redelivered entry (the same key) is stored once; failures are kept
// apart too; other subjects are not mixed in.
func TestLogRecentOrderedAndIdempotent(t *testing.T) {
	l, srv := newLog(t)
	for _, i := range []int{2, 0, 1} {
		outcome := events.OutcomeFailure
		if i == 1 {
			outcome = events.OutcomeSuccess
		}
		record(t, srv.JS, "css_fix", subject, entry(i, outcome))
	}
	record(t, srv.JS, "css_fix", subject, entry(2, events.OutcomeFailure)) // redelivered
	record(t, srv.JS, "css_fix", "other.go", entry(9, events.OutcomeFailure))
	record(t, srv.JS, "js_fix", subject, entry(8, events.OutcomeFailure))

	rec, err := l.Recent(t.Context(), "css_fix", subject)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := keys(rec.Outcomes), []string{"t0:1", "t1:1", "t2:1"}; !slices.Equal(got, want) {
		t.Errorf("outcomes = %v, want %v", got, want)
	}
	if got, want := keys(rec.Failures), []string{"t0:1", "t2:1"}; !slices.Equal(got, want) {
		t.Errorf("failures = %v, want %v", got, want)
	}
	if rec.Outcomes[1].Outcome != events.OutcomeSuccess || rec.Outcomes[0].TaskID != "t0" {
		t.Errorf("entries = %+v", rec.Outcomes)
	}
}

// The stream keeps the last Keep outcomes and, apart, the last Keep
// failures: a subject that failed long ago and then succeeded many times
// still shows its failures.
func TestLogKeepsKeepOfEachKind(t *testing.T) {
	l, srv := newLog(t)
	for i := range history.Keep + 2 {
		record(t, srv.JS, "css_fix", subject, entry(i, events.OutcomeFailure))
	}
	for i := history.Keep + 2; i < 3*history.Keep; i++ {
		record(t, srv.JS, "css_fix", subject, entry(i, events.OutcomeSuccess))
	}
	rec, err := l.Recent(t.Context(), "css_fix", subject)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Outcomes) != history.Keep || rec.Outcomes[0].Key != fmt.Sprintf("t%d:1", 2*history.Keep) {
		t.Errorf("outcomes = %v", keys(rec.Outcomes))
	}
	if len(rec.Failures) != history.Keep || rec.Failures[0].Key != "t2:1" {
		t.Errorf("failures = %v", keys(rec.Failures))
	}
	since := at.Add(4 * time.Minute)
	if n := history.Failures(rec.Failures, since); n != history.Keep-2 {
		t.Errorf("failures since %s = %d, want %d", since, n, history.Keep-2)
	}
}

// Many recorders on one subject at once: nothing to compare-and-set, so
// nothing is lost; each kind keeps its newest Keep.
func TestLogConcurrentRecorders(t *testing.T) {
	const writers, perWriter = 8, 20
	l, srv := newLog(t)
	var wg sync.WaitGroup
	for w := range writers {
		_, js := srv.Connect(t)
		wg.Go(func() {
			for i := range perWriter {
				e := history.Entry{Key: fmt.Sprintf("w%d-%d:1", w, i), Outcome: events.OutcomeSuccess, At: at.Add(time.Duration(i*writers+w) * time.Second)}
				msgs, _ := history.Msgs("css_fix", subject, e)
				for _, m := range msgs {
					if _, err := js.PublishMsg(context.Background(), m); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	all, err := history.ReadAll(t.Context(), srv.JS)
	if err != nil {
		t.Fatal(err)
	}
	rec := all[history.Key("css_fix", subject)]
	if rec == nil || len(rec.Outcomes) != history.Keep || rec.Subject != subject {
		t.Fatalf("ReadAll = %+v", rec)
	}
	recent, err := l.Recent(t.Context(), "css_fix", subject)
	if err != nil || !slices.Equal(keys(recent.Outcomes), keys(rec.Outcomes)) {
		t.Errorf("Recent %v and ReadAll %v disagree (%v)", keys(recent.Outcomes), keys(rec.Outcomes), err)
	}
}

// ReadAll and Record.Add agree: what the stream keeps is what a replay
// of the same entries builds.
func TestReadAllMatchesRecordAdd(t *testing.T) {
	_, srv := newLog(t)
	var want history.Record
	for i := range 12 {
		outcome := events.OutcomeSuccess
		if i%3 == 0 {
			outcome = events.OutcomeFailure
		}
		e := entry(i, outcome)
		record(t, srv.JS, "css_fix", subject, e)
		want, _ = want.Add(e)
	}
	all, err := history.ReadAll(t.Context(), srv.JS)
	if err != nil {
		t.Fatal(err)
	}
	got := all[history.Key("css_fix", subject)]
	if got == nil || !slices.Equal(keys(got.Outcomes), keys(want.Outcomes)) || !slices.Equal(keys(got.Failures), keys(want.Failures)) {
		t.Fatalf("ReadAll = %+v, want outcomes %v failures %v", got, keys(want.Outcomes), keys(want.Failures))
	}
	if again, changed := want.Add(entry(11, events.OutcomeSuccess)); changed || len(again.Outcomes) != len(want.Outcomes) {
		t.Error("Add of an entry already kept changed the record")
	}
}

func TestMsgsRejectsInvalidInput(t *testing.T) {
	if _, err := history.Msgs("CSS.fix", subject, entry(1, events.OutcomeSuccess)); !errors.Is(err, history.ErrInvalid) {
		t.Errorf("invalid type: err = %v", err)
	}
	if _, err := history.Msgs("css_fix", subject, history.Entry{}); !errors.Is(err, history.ErrInvalid) {
		t.Errorf("entry without a key: err = %v", err)
	}
	l, _ := newLog(t)
	if _, err := l.Recent(t.Context(), "CSS.fix", subject); !errors.Is(err, history.ErrInvalid) {
		t.Errorf("Recent of an invalid type: err = %v", err)
	}
	msgs, err := history.Msgs("css_fix", subject, entry(1, events.OutcomeFailure))
	if err != nil || len(msgs) != 2 || msgs[0].Header.Get(nats.MsgIdHdr) == msgs[1].Header.Get(nats.MsgIdHdr) {
		t.Errorf("a failure's messages: %v %v", msgs, err)
	}
}
