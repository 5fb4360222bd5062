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

	"dispatchmesh/history"
	"dispatchmesh/internal/natstest"
)

const subject = "src/app/handlers/response.go"

func newStore(t *testing.T, limit int) (*history.Store, jetstream.KeyValue) {
	t.Helper()
	srv := natstest.Start(t)
	kv, err := srv.JS.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "test_history"})
	if err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	return history.NewStore(kv, limit), kv
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
	if k != history.Key("css_fix", subject) || k == history.Key("css_fix", subject+"x") || k == history.Key("js_fix", subject) {
		t.Error("Key is not a function of exactly (type, subject)")
	}
}

func TestStoreRecentAbsent(t *testing.T) {
	store, _ := newStore(t, 0)
	got, err := store.Recent(t.Context(), "css_fix", subject, 5)
	if err != nil || len(got) != 0 {
		t.Errorf("Recent on no history = %v, %v", got, err)
	}
}

func TestStoreAppendIdempotentAndOrdered(t *testing.T) {
	store, kv := newStore(t, 0)
	ctx := t.Context()
	// Appended out of time order, one twice.
	for _, i := range []int{1, 3, 2, 3, 4} {
		if err := store.Append(ctx, "css_fix", subject, entry(i, "failure")); err != nil {
			t.Fatal(err)
		}
	}
	all, err := store.Recent(ctx, "css_fix", subject, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"t1:1", "t2:1", "t3:1", "t4:1"}; !slices.Equal(keys(all), want) {
		t.Errorf("entries = %v, want %v", keys(all), want)
	}
	last, err := store.Recent(ctx, "css_fix", subject, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"t3:1", "t4:1"}; !slices.Equal(keys(last), want) {
		t.Errorf("Recent(2) = %v, want %v", keys(last), want)
	}
	if got, _ := store.Recent(ctx, "css_fix", subject, 10); len(got) != 4 {
		t.Errorf("Recent(10) returned %d entries, want 4", len(got))
	}

	// The stored value names its type and subject.
	e, err := kv.Get(ctx, history.Key("css_fix", subject))
	if err != nil {
		t.Fatal(err)
	}
	if want := `"type":"css_fix","subject":"` + subject + `"`; !regexp.MustCompile(regexp.QuoteMeta(want)).Match(e.Value()) {
		t.Errorf("stored value %s lacks %s", e.Value(), want)
	}
}

func TestStoreAppendBounded(t *testing.T) {
	store, _ := newStore(t, 3)
	ctx := t.Context()
	for i := 1; i <= 5; i++ {
		if err := store.Append(ctx, "css_fix", subject, entry(i, "failure")); err != nil {
			t.Fatal(err)
		}
	}
	// An entry older than everything kept is dropped at once.
	if err := store.Append(ctx, "css_fix", subject, entry(0, "failure")); err != nil {
		t.Fatal(err)
	}
	all, err := store.Recent(ctx, "css_fix", subject, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"t3:1", "t4:1", "t5:1"}; !slices.Equal(keys(all), want) {
		t.Errorf("entries = %v, want %v", keys(all), want)
	}
}

func TestStoreFailuresSince(t *testing.T) {
	store, _ := newStore(t, 0)
	ctx := t.Context()
	outcomes := []string{"failure", "success", "failure", "failure", "success", "failure"}
	for i, o := range outcomes {
		if err := store.Append(ctx, "css_fix", subject, entry(i, o)); err != nil {
			t.Fatal(err)
		}
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
		got, err := store.FailuresSince(ctx, "css_fix", subject, tt.since)
		if err != nil {
			t.Fatal(err)
		}
		if got != tt.want {
			t.Errorf("FailuresSince(%v) = %d, want %d", tt.since, got, tt.want)
		}
	}
	if n, err := store.FailuresSince(ctx, "css_fix", "other/file.go", at.Add(-time.Hour)); err != nil || n != 0 {
		t.Errorf("FailuresSince on another subject = %d, %v", n, err)
	}
}

func TestStoreConcurrentAppends(t *testing.T) {
	const writers, perWriter = 4, 20
	store, _ := newStore(t, 200)
	ctx := t.Context()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				e := entry(w*perWriter+i, "failure")
				if err := store.Append(ctx, "css_fix", subject, e); err != nil {
					t.Errorf("writer %d append %d: %v", w, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	all, err := store.Recent(ctx, "css_fix", subject, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != writers*perWriter {
		t.Fatalf("kept %d entries, want %d (lost appends)", len(all), writers*perWriter)
	}
	if !slices.IsSortedFunc(all, func(a, b history.Entry) int { return a.At.Compare(b.At) }) {
		t.Errorf("entries not in time order: %v", keys(all))
	}
}

func TestStorePut(t *testing.T) {
	store, _ := newStore(t, 2)
	ctx := t.Context()
	if err := store.Append(ctx, "css_fix", subject, entry(9, "success")); err != nil {
		t.Fatal(err)
	}
	if err := store.Put(ctx, "css_fix", subject, []history.Entry{entry(1, "failure"), entry(2, "failure"), entry(3, "success")}); err != nil {
		t.Fatal(err)
	}
	all, err := store.Recent(ctx, "css_fix", subject, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"t2:1", "t3:1"}; !slices.Equal(keys(all), want) {
		t.Errorf("after Put: %v, want %v", keys(all), want)
	}
}

func TestStoreRejectsInvalidInput(t *testing.T) {
	store, _ := newStore(t, 0)
	ctx := t.Context()
	if err := store.Append(ctx, "css_fix", subject, history.Entry{Outcome: "failure"}); !errors.Is(err, history.ErrInvalid) {
		t.Errorf("entry without a key: err = %v", err)
	}
	if err := store.Append(ctx, "CSS.fix", subject, entry(1, "failure")); !errors.Is(err, history.ErrInvalid) {
		t.Errorf("invalid type: err = %v", err)
	}
	if _, err := store.Recent(ctx, "", subject, 1); !errors.Is(err, history.ErrInvalid) {
		t.Errorf("empty type: err = %v", err)
	}
}

// Clone copies the entries: a change to the copy leaves the original as
// its JSON says it was.
func TestRecordClone(t *testing.T) {
	at := time.Date(2026, 5, 18, 14, 0, 0, 0, time.UTC)
	r := history.Record{Type: "css_fix", Subject: "a.css", Entries: []history.Entry{
		{Key: "a:1", TaskID: "a", Attempt: 1, Outcome: "failure", Approach: "guess", Error: "no", At: at},
		{Key: "b:1", TaskID: "b", Attempt: 1, Outcome: "success", Summary: "fixed", At: at},
	}}
	before, _ := json.Marshal(r)
	c := r.Clone()
	if after, _ := json.Marshal(c); string(after) != string(before) {
		t.Fatalf("clone %s, want %s", after, before)
	}
	c.Entries[0].Summary = "changed"
	c.Entries = append(c.Entries[:1], history.Entry{Key: "z"})
	if after, _ := json.Marshal(r); string(after) != string(before) {
		t.Fatalf("changing the clone changed the original: %s, want %s", after, before)
	}
}
