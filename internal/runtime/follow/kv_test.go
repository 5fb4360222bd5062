package follow_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/runtime/follow"
	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
)

// next is the next entry of w ("<nil>" for the marker), or fails.
func next(t *testing.T, w jetstream.KeyWatcher) string {
	t.Helper()
	select {
	case e, ok := <-w.Updates():
		switch {
		case !ok:
			return "closed"
		case e == nil:
			return "<nil>"
		}
		return fmt.Sprintf("%s=%s@%d/%s", e.Key(), e.Value(), e.Revision(), e.Operation())
	case <-time.After(patience):
		t.Fatal("no entry")
		return ""
	}
}

func nexts(t *testing.T, w jetstream.KeyWatcher, n int) []string {
	t.Helper()
	var got []string
	for range n {
		got = append(got, next(t, w))
	}
	return got
}

func bucket(t *testing.T, js jetstream.JetStream, history uint8) jetstream.KeyValue {
	t.Helper()
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "b", History: history})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func put(t *testing.T, kv jetstream.KeyValue, key, value string) uint64 {
	t.Helper()
	rev, err := kv.Put(t.Context(), key, []byte(value))
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// Watch passes on what kv.Watch does: the current values, the nil marker,
// then every change, deletes included unless IgnoreDeletes; UpdatesOnly
// has no current values and no marker; Stop closes Updates.
func TestWatchKeepsTheWatcherSemantics(t *testing.T) {
	srv := natstest.Start(t)
	ctx := t.Context()
	kv := bucket(t, srv.JS, 5)
	put(t, kv, "a", "1")
	put(t, kv, "b", "1")
	put(t, kv, "a", "2")
	if err := kv.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	quiet := follow.WatchOptions{Log: discard}

	all, err := follow.WatchAll(ctx, srv.JS, kv, quiet)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a=2@3/KeyValuePutOp", "b=@4/KeyValueDeleteOp", "<nil>"}
	if got := nexts(t, all, 3); !slices.Equal(got, want) {
		t.Errorf("WatchAll: %v, want %v", got, want)
	}
	one, err := follow.Watch(ctx, srv.JS, kv, "a", follow.WatchOptions{IgnoreDeletes: true, Log: discard})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := nexts(t, one, 2), []string{"a=2@3/KeyValuePutOp", "<nil>"}; !slices.Equal(got, want) {
		t.Errorf("Watch a: %v, want %v", got, want)
	}
	updates, err := follow.WatchAll(ctx, srv.JS, kv, follow.WatchOptions{UpdatesOnly: true, Log: discard})
	if err != nil {
		t.Fatal(err)
	}
	empty, err := follow.Watch(ctx, srv.JS, kv, "none.>", quiet)
	if err != nil {
		t.Fatal(err)
	}
	if got := next(t, empty); got != "<nil>" {
		t.Errorf("no key: %s, want the marker", got)
	}

	put(t, kv, "a", "3")
	if err := kv.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	put(t, kv, "b", "2")
	want = []string{"a=3@5/KeyValuePutOp", "a=@6/KeyValueDeleteOp", "b=2@7/KeyValuePutOp"}
	if got := nexts(t, all, 3); !slices.Equal(got, want) {
		t.Errorf("WatchAll changes: %v, want %v", got, want)
	}
	if got := nexts(t, updates, 3); !slices.Equal(got, want) {
		t.Errorf("UpdatesOnly: %v, want %v", got, want)
	}
	if got := next(t, one); got != "a=3@5/KeyValuePutOp" {
		t.Errorf("Watch a, IgnoreDeletes: %s", got)
	}

	if err := all.Stop(); err != nil {
		t.Fatal(err)
	}
	for range all.Updates() { // drained, then closed
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := follow.WatchAll(wctx, srv.JS, kv, quiet)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	for range w.Updates() { // closed when its context ends
	}
}

// A watcher's inbox fed by a consumer of another stream (a value of the
// attacker's choosing, under the key's very subject, at a revision far
// ahead), and by another consumer of the bucket's own stream (an old
// revision, replayed): nothing is passed on, both are counted and logged,
// and the next real change is passed on. (nats.go's watcher passes the first
// on as an entry of the key, at the attacker's revision, and loses every
// later change.)
func TestWatchTakesNoForgedEntry(t *testing.T) {
	srv := natstest.Start(t)
	ctx := t.Context()
	kv := bucket(t, srv.JS, 5)
	put(t, kv, "k", "old")
	put(t, kv, "k", "current")
	nc, js := srv.Connect(t)
	logs := &logBuffer{}
	w, err := follow.Watch(ctx, js, kv, "k", follow.WatchOptions{Log: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if got, want := nexts(t, w, 2), []string{"k=current@2/KeyValuePutOp", "<nil>"}; !slices.Equal(got, want) {
		t.Fatalf("start: %v, want %v", got, want)
	}

	var forged []*nats.Msg
	for range 5 { // delivery sequences 1..5: one is the watcher's next
		m := nats.NewMsg("$KV.b.k") // the key's very subject, in another stream
		m.Header.Set("KV-Operation", "PUT")
		m.Data = []byte("forged")
		forged = append(forged, m)
	}
	forgeAll(t, srv, nc, natstest.ForgedStream(t, srv.JS, forged...), 0)
	forgeAll(t, srv, nc, "KV_b", 1) // revision 1 again
	eventually(t, "seven forged deliveries dropped", func() bool { return w.Forged() >= 7 })
	if !logs.has("claimed_stream=FORGED_") || !logs.has("claimed_stream=KV_b") || !logs.has("subject=$KV.b.k") {
		t.Errorf("forged deliveries not logged with what they claim:\n%s", logs)
	}

	put(t, kv, "k", "next")
	if got := next(t, w); got != "k=next@3/KeyValuePutOp" {
		t.Errorf("after the forged deliveries: %s, want the next real change", got)
	}
}

// Stop ends a watch whose Updates nobody reads (its handler waiting to
// pass an entry on): its consumer is deleted and Updates closed.
func TestWatchStopsUnread(t *testing.T) {
	srv := natstest.Start(t)
	ctx := t.Context()
	kv := bucket(t, srv.JS, 1)
	for i := range 300 { // more than Updates holds
		put(t, kv, fmt.Sprintf("k%d", i), "v")
	}
	w, err := follow.WatchAll(ctx, srv.JS, kv, follow.WatchOptions{Log: discard})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "Updates full", func() bool { return len(w.Updates()) == cap(w.Updates()) })
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	stream, err := srv.JS.Stream(ctx, "KV_b")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch's consumer deleted, nothing read", func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.Consumers == 0
	})
	closed := make(chan struct{})
	go func() {
		for range w.Updates() {
		}
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(patience):
		t.Fatal("Updates not closed after Stop")
	}
}

// History is kv.History: every revision of the key the bucket holds,
// oldest first, deletes included; ErrKeyNotFound for a key without any.
func TestHistory(t *testing.T) {
	srv := natstest.Start(t)
	ctx := t.Context()
	kv := bucket(t, srv.JS, 5)
	put(t, kv, "k", "1")
	put(t, kv, "other", "x")
	put(t, kv, "k", "2")
	if err := kv.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	all, err := follow.History(ctx, srv.JS, kv, "k", discard)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range all {
		got = append(got, fmt.Sprintf("%s=%s@%d/%s", e.Key(), e.Value(), e.Revision(), e.Operation()))
	}
	if want := []string{"k=1@1/KeyValuePutOp", "k=2@3/KeyValuePutOp", "k=@4/KeyValueDeleteOp"}; !slices.Equal(got, want) {
		t.Errorf("History = %v, want %v", got, want)
	}
	if _, err := follow.History(ctx, srv.JS, kv, "none", discard); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("History of a key without revisions: %v, want ErrKeyNotFound", err)
	}
}
