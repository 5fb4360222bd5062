package follow

import (
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/testkit/natstest"
)

// What a watch passes on is read back from the bucket by revision: the
// delivered bytes are never used, and a revision that holds another key
// passes nothing on.
func TestReadBack(t *testing.T) {
	srv := natstest.Start(t)
	ctx := t.Context()
	kv, err := srv.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("stored")); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "other", []byte("x")); err != nil {
		t.Fatal(err)
	}
	stream, err := srv.JS.Stream(ctx, "KV_b")
	if err != nil {
		t.Fatal(err)
	}
	r := &reader{stream: stream, bucket: "b", pre: "$KV.b.", log: slog.New(slog.DiscardHandler)}
	e := r.read(ctx, Msg{Subject: "$KV.b.k", Seq: 1, Data: []byte("forged"), Pending: 7})
	if e == nil || string(e.Value()) != "stored" || e.Revision() != 1 || e.Key() != "k" || e.Delta() != 7 || e.Operation() != jetstream.KeyValuePut {
		t.Errorf("read back %+v, want k=stored at revision 1", e)
	}
	if e := r.read(ctx, Msg{Subject: "$KV.b.k", Seq: 2}); e != nil {
		t.Errorf("revision 2 holds another key, passed on %+v", e)
	}
	if e := r.read(ctx, Msg{Subject: "$KV.b..k", Seq: 1}); e != nil {
		t.Errorf("an invalid key passed on %+v", e)
	}
}
