package rebuild

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/history"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
	"github.com/dispatchmesh/dispatchmesh/trust"
)

// The gate's canary places are nothing events imply: a type whose only
// gate facts are canary places, or whose facts are all zero, needs no
// entry, and differs from none. Its block streak and decisions do.
func TestGateFactsLeaveCanariesOut(t *testing.T) {
	canary := []trust.Canary{{Key: "t-1", At: time.Unix(100, 0).UTC()}}
	live := map[string]*trust.Stats{
		"css_fix":  {Type: "css_fix", Canaries: canary},
		"docs_fix": {Type: "docs_fix", BlockStreak: 2, Gates: []trust.GateMark{{Key: "d:1:gate"}, {Key: "d2:1:gate"}}, Canaries: canary},
	}
	rebuilt := map[string]*trust.Stats{
		"css_fix":  {Type: "css_fix", Outcomes: []trust.Outcome{{Key: "t-1:1:outcome"}}},
		"docs_fix": {Type: "docs_fix", BlockStreak: 1, Gates: []trust.GateMark{{Key: "d:1:gate"}}},
		"lint_fix": {Type: "lint_fix"},
	}
	diffs := compareValues("trust", live, rebuilt, gateFacts, noGateFacts)
	want := []Difference{
		{"trust", "docs_fix", "block_streak", "2", "1"},
		{"trust", "docs_fix", "gates", "2 entries, only here: d2:1:gate", "1 entry"},
	}
	if !slices.Equal(diffs, want) {
		t.Fatalf("differences:\n%v\nwant\n%v", diffs, want)
	}
}

// Outcomes are compared as deep as a policy may score (OutcomeDepth);
// older ones depend on the order concurrent recorders published them in.
func TestOutcomesComparedToTheLargestWindow(t *testing.T) {
	at := time.Unix(1000, 0).UTC()
	var all []trust.Outcome
	for i := range trust.Keep {
		all = append(all, trust.Outcome{Key: fmt.Sprintf("t-%03d:1:outcome", i), Success: true, At: at.Add(time.Duration(i) * time.Second)})
	}
	older := slices.Clone(all)
	older[0].Key = "late:1:outcome" // beyond the newest OutcomeDepth
	live := map[string]*trust.Stats{"css_fix": {Type: "css_fix", Outcomes: older}}
	rebuilt := map[string]*trust.Stats{"css_fix": {Type: "css_fix", Outcomes: all}}
	if diffs := compareValues(StoreOutcomes, live, rebuilt, newestOutcomes, noOutcomes); len(diffs) != 0 {
		t.Fatalf("an outcome older than the newest %d differs: %v", OutcomeDepth, diffs)
	}
	newer := slices.Clone(all)
	newer[len(newer)-1].Success = false
	live["css_fix"].Outcomes = newer
	diffs := compareValues(StoreOutcomes, live, rebuilt, newestOutcomes, noOutcomes)
	last := all[len(all)-1].Key
	if len(diffs) != 1 || diffs[0].Field != "outcomes" || !strings.Contains(diffs[0].Live, last) ||
		!strings.Contains(diffs[0].Live, `"success":false`) || !strings.Contains(diffs[0].Built, `"success":true`) {
		t.Fatalf("a changed newest outcome: %v", diffs)
	}
	live["css_fix"].Outcomes = nil
	if diffs := compareValues(StoreOutcomes, live, rebuilt, newestOutcomes, noOutcomes); len(diffs) != 1 || diffs[0].Field != "(entry)" {
		t.Fatalf("a type without outcomes: %v", diffs)
	}
}

// historyRecord is a (type, subject)'s record of n attempts, each failed
// when fail says so, built as the recorder builds it (Record.Add).
func historyRecord(typ, subject string, n int, fail func(i int) bool) *history.Record {
	rec := history.Record{Type: typ, Subject: subject}
	at := time.Unix(1000, 0).UTC()
	for i := range n {
		outcome := events.OutcomeSuccess
		if fail(i) {
			outcome = events.OutcomeFailure
		}
		rec, _ = rec.Add(history.Entry{Key: fmt.Sprintf("%s-%d:1:outcome", subject, i), TaskID: fmt.Sprintf("%s-%d", subject, i),
			Attempt: 1, Outcome: outcome, At: at.Add(time.Duration(i) * time.Second)})
	}
	return &rec
}

// The history bucket is compared as stored, record by record and field by
// field: an equal record is no difference; one written by hand with an
// entry twice, or by the former layout (every entry under "entries"),
// differs in the fields that are not as rebuilt; a record no event
// implies, or a missing one, differs as an entry.
func TestHistoryComparedAsStored(t *testing.T) {
	a := historyRecord("css_fix", "a.css", 7, func(i int) bool { return i%2 == 0 })
	b := historyRecord("css_fix", "b.css", 2, func(int) bool { return false })
	c := historyRecord("css_fix", "c.css", 1, func(int) bool { return true })
	ka, kb, kc := history.Key("css_fix", "a.css"), history.Key("css_fix", "b.css"), history.Key("css_fix", "c.css")
	rebuilt := map[string]*history.Record{ka: a, kb: b, kc: c}
	stored := asStored(rebuilt)
	if diffs := compareValues(events.BucketHistory, stored, asStored(rebuilt), same[json.RawMessage], nil); len(diffs) != 0 {
		t.Fatalf("the records as rebuilt differ: %v", diffs)
	}

	twice := a.Clone()
	twice.Failures = append(twice.Failures[1:], twice.Failures[len(twice.Failures)-1])
	old, _ := json.Marshal(map[string]any{"type": b.Type, "subject": b.Subject, "entries": b.Outcomes})
	live := map[string]*json.RawMessage{
		ka:                              ptr(marshal(twice)),
		kb:                              ptr(json.RawMessage(old)),
		history.Key("css_fix", "x.css"): ptr(marshal(historyRecord("css_fix", "x.css", 1, func(int) bool { return false }))),
	}
	diffs := compareValues(events.BucketHistory, live, stored, same[json.RawMessage], nil)
	want := []Difference{
		{events.BucketHistory, ka, "failures", "4 entries", "4 entries, only here: " + a.Failures[0].Key},
		{events.BucketHistory, kb, "entries", "2 entries, only here: " + b.Outcomes[0].Key + " " + b.Outcomes[1].Key, "0 entries"},
		{events.BucketHistory, kb, "outcomes", "0 entries", "2 entries, only here: " + b.Outcomes[0].Key + " " + b.Outcomes[1].Key},
		{events.BucketHistory, kc, "(entry)", "missing", "present"},
		{events.BucketHistory, history.Key("css_fix", "x.css"), "(entry)", "present", "missing"},
	}
	slices.SortFunc(want, func(x, y Difference) int { return strings.Compare(x.Key+x.Field, y.Key+y.Field) })
	if !slices.Equal(diffs, want) {
		t.Fatalf("differences:\n%v\nwant\n%v", diffs, want)
	}
}

// Apply writes the history records that differ, and only those, deletes
// the one no event implies, and finds nothing to write when applied again.
func TestApplyRewritesTheHistoryRecordsThatDiffer(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	kv, err := srv.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: events.BucketHistory})
	if err != nil {
		t.Fatal(err)
	}
	a := historyRecord("css_fix", "a.css", 7, func(i int) bool { return i%2 == 0 })
	b := historyRecord("css_fix", "b.css", 2, func(int) bool { return false })
	c := historyRecord("css_fix", "c.css", 1, func(int) bool { return true })
	x := historyRecord("css_fix", "x.css", 1, func(int) bool { return false })
	ka, kb, kc, kx := history.Key("css_fix", "a.css"), history.Key("css_fix", "b.css"), history.Key("css_fix", "c.css"), history.Key("css_fix", "x.css")
	put := func(k string, v any) uint64 {
		t.Helper()
		data, _ := json.Marshal(v)
		rev, err := kv.Put(ctx, k, data)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	revA := put(ka, a) // as rebuilt
	put(kb, map[string]any{"type": b.Type, "subject": b.Subject, "entries": b.Outcomes})
	put(kx, x)
	built := &Stores{History: map[string]*history.Record{ka: a, kb: b, kc: c}}
	live := Live{History: kv}
	diffs, err := Compare(ctx, live, built)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, d := range diffs {
		keys[d.Key] = true
	}
	if len(keys) != 3 || !keys[kb] || !keys[kc] || !keys[kx] {
		t.Fatalf("differences: %v", diffs)
	}
	if err := Apply(ctx, live, built); err != nil {
		t.Fatal(err)
	}
	if diffs, err := Compare(ctx, live, built); err != nil || len(diffs) != 0 {
		t.Fatalf("after Apply: %v %v", diffs, err)
	}
	if e, err := kv.Get(ctx, ka); err != nil || e.Revision() != revA {
		t.Fatalf("a record as rebuilt was written again: %v", err)
	}
	if _, err := kv.Get(ctx, kx); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the record no event implies: %v", err)
	}
	rec, err := history.NewStore(kv).Recent(ctx, "css_fix", "b.css")
	if err != nil || !slices.Equal(rec.Outcomes, b.Outcomes) {
		t.Fatalf("b.css after Apply: %+v %v", rec, err)
	}
	status, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := status.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq
	if err := Apply(ctx, live, built); err != nil {
		t.Fatal(err)
	}
	status, err = kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after := status.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq; after != before {
		t.Fatalf("a second Apply wrote the bucket: last sequence %d, then %d", before, after)
	}
}

func ptr[T any](v T) *T { return &v }
