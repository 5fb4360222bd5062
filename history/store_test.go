package history_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
)

const subject = "src/app/handlers/response.go"

func newStore(t *testing.T) (*history.Store, jetstream.KeyValue, *natstest.Server) {
	t.Helper()
	srv := natstest.Start(t)
	kv, err := srv.JS.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "test_history"})
	if err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	return history.NewStore(kv), kv, srv
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
}

func TestStoreRecentAbsent(t *testing.T) {
	store, _, _ := newStore(t)
	rec, err := store.Recent(t.Context(), "css_fix", subject)
	if err != nil || len(rec.Outcomes) != 0 || len(rec.Failures) != 0 || rec.Type != "css_fix" || rec.Subject != subject {
		t.Errorf("Recent on no history = %+v, %v", rec, err)
	}
}

// Entries come back in time order whatever order they were appended in; a
// redelivered entry (the same key) is kept once; failures are kept apart
// too; the stored value names its type and subject.
func TestStoreAppendIdempotentAndOrdered(t *testing.T) {
	store, kv, _ := newStore(t)
	ctx := t.Context()
	for _, i := range []int{1, 3, 2, 3, 4} {
		outcome := events.OutcomeFailure
		if i == 2 {
			outcome = events.OutcomeSuccess
		}
		if err := store.Append(ctx, "css_fix", subject, entry(i, outcome)); err != nil {
			t.Fatal(err)
		}
	}
	rec, err := store.Recent(ctx, "css_fix", subject)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"t1:1", "t2:1", "t3:1", "t4:1"}; !slices.Equal(keys(rec.Outcomes), want) {
		t.Errorf("outcomes = %v, want %v", keys(rec.Outcomes), want)
	}
	if want := []string{"t1:1", "t3:1", "t4:1"}; !slices.Equal(keys(rec.Failures), want) {
		t.Errorf("failures = %v, want %v", keys(rec.Failures), want)
	}
	e, err := kv.Get(ctx, history.Key("css_fix", subject))
	if err != nil {
		t.Fatal(err)
	}
	if want := `"type":"css_fix","subject":"` + subject + `"`; !regexp.MustCompile(regexp.QuoteMeta(want)).Match(e.Value()) {
		t.Errorf("stored value %s lacks %s", e.Value(), want)
	}
}

// The history keeps the last Keep outcomes and, apart, the last Keep
// failures: a subject that failed a while ago and then succeeded many
// times still shows its failures. An entry older than everything kept is
// dropped at once.
func TestStoreKeepsKeepOfEachKind(t *testing.T) {
	store, _, _ := newStore(t)
	ctx := t.Context()
	for i := range history.Keep + 2 {
		if err := store.Append(ctx, "css_fix", subject, entry(i+1, events.OutcomeFailure)); err != nil {
			t.Fatal(err)
		}
	}
	for i := history.Keep + 3; i <= 3*history.Keep; i++ {
		if err := store.Append(ctx, "css_fix", subject, entry(i, events.OutcomeSuccess)); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.Append(ctx, "css_fix", subject, entry(0, events.OutcomeSuccess)); err != nil {
		t.Fatal(err)
	}
	rec, err := store.Recent(ctx, "css_fix", subject)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Outcomes) != history.Keep || rec.Outcomes[0].Key != fmt.Sprintf("t%d:1", 2*history.Keep+1) {
		t.Errorf("outcomes = %v", keys(rec.Outcomes))
	}
	if len(rec.Failures) != history.Keep || rec.Failures[0].Key != "t3:1" {
		t.Errorf("failures = %v", keys(rec.Failures))
	}
	if n := history.Failures(rec.Failures, at.Add(5*time.Minute)); n != history.Keep-2 {
		t.Errorf("failures since minute 5 = %d, want %d", n, history.Keep-2)
	}
}

func TestFailures(t *testing.T) {
	var es []history.Entry
	for i, o := range []string{"failure", "success", "failure", "failure", "success", "failure"} {
		es = append(es, entry(i, o))
	}
	tests := []struct {
		since time.Time
		want  int
	}{
		{at.Add(-time.Hour), 4},
		{at, 4},
		{at.Add(2 * time.Minute), 3}, // inclusive: entry 2 is at exactly this time
		{at.Add(2*time.Minute + time.Second), 2},
		{at.Add(time.Hour), 0},
	}
	for _, tt := range tests {
		if got := history.Failures(es, tt.since); got != tt.want {
			t.Errorf("Failures since %v = %d, want %d", tt.since, got, tt.want)
		}
	}
}

// Recorders in separate processes appending to one subject at once lose
// nothing: each append is a compare-and-set, retried on conflict.
func TestStoreConcurrentAppends(t *testing.T) {
	const writers, perWriter = 4, 20
	_, _, srv := newStore(t)
	ctx := t.Context()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []history.Entry
	for w := range writers {
		_, js := srv.Connect(t)
		kv, err := js.KeyValue(ctx, "test_history")
		if err != nil {
			t.Fatal(err)
		}
		store := history.NewStore(kv)
		wg.Go(func() {
			for i := range perWriter {
				e := entry(w*perWriter+i, events.OutcomeFailure)
				if err := store.Append(ctx, "css_fix", subject, e); err != nil {
					t.Errorf("writer %d append %d: %v", w, i, err)
					return
				}
				mu.Lock()
				failures = append(failures, e)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	var want history.Record
	for _, e := range failures {
		want, _ = want.Add(e)
	}
	kv, _ := srv.JS.KeyValue(ctx, "test_history")
	rec, err := history.NewStore(kv).Recent(ctx, "css_fix", subject)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys(rec.Outcomes), keys(want.Outcomes)) || !slices.Equal(keys(rec.Failures), keys(want.Failures)) {
		t.Fatalf("kept %v / %v, want the newest %v (lost appends)", keys(rec.Outcomes), keys(rec.Failures), keys(want.Outcomes))
	}
}

func TestStorePut(t *testing.T) {
	store, _, _ := newStore(t)
	ctx := t.Context()
	if err := store.Append(ctx, "css_fix", subject, entry(9, events.OutcomeSuccess)); err != nil {
		t.Fatal(err)
	}
	put := history.Record{Type: "css_fix", Subject: subject, Outcomes: []history.Entry{entry(2, events.OutcomeFailure), entry(3, events.OutcomeSuccess)},
		Failures: []history.Entry{entry(2, events.OutcomeFailure)}}
	if err := store.Put(ctx, put); err != nil {
		t.Fatal(err)
	}
	rec, err := store.Recent(ctx, "css_fix", subject)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys(rec.Outcomes), []string{"t2:1", "t3:1"}) || !slices.Equal(keys(rec.Failures), []string{"t2:1"}) {
		t.Errorf("after Put: %+v", rec)
	}
}

func TestStoreRejectsInvalidInput(t *testing.T) {
	store, _, _ := newStore(t)
	ctx := t.Context()
	if err := store.Append(ctx, "css_fix", subject, history.Entry{Outcome: "failure"}); !errors.Is(err, history.ErrInvalid) {
		t.Errorf("entry without a key: err = %v", err)
	}
	if err := store.Append(ctx, "CSS.fix", subject, entry(1, "failure")); !errors.Is(err, history.ErrInvalid) {
		t.Errorf("invalid type: err = %v", err)
	}
	if _, err := store.Recent(ctx, "", subject); !errors.Is(err, history.ErrInvalid) {
		t.Errorf("empty type: err = %v", err)
	}
	if err := store.Put(ctx, history.Record{}); !errors.Is(err, history.ErrInvalid) {
		t.Errorf("put without a type: err = %v", err)
	}
}

// Clone copies the entries: a change to the copy leaves the original as
// its JSON says it was.
func TestRecordClone(t *testing.T) {
	r := history.Record{Type: "css_fix", Subject: "a.css",
		Outcomes: []history.Entry{entry(1, "failure"), entry(2, "success")}, Failures: []history.Entry{entry(1, "failure")}}
	before, _ := json.Marshal(r)
	c := r.Clone()
	if after, _ := json.Marshal(c); string(after) != string(before) {
		t.Fatalf("clone %s, want %s", after, before)
	}
	c.Outcomes[0].Summary = "changed"
	c.Failures[0].Summary = "changed"
	c.Outcomes = append(c.Outcomes[:1], history.Entry{Key: "z"})
	if after, _ := json.Marshal(r); string(after) != string(before) {
		t.Fatalf("changing the clone changed the original: %s, want %s", after, before)
	}
}
