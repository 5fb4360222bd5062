package policykv

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// ErrNoShadow is returned by Promote when the bucket holds no shadow
// policy.
var ErrNoShadow = errors.New("policy: no shadow policy to promote")

// PutShadow stores f as the shadow policy beside the one in force and
// returns its revision. A policy that does not validate is refused before
// anything is written.
func PutShadow(ctx context.Context, kv jetstream.KeyValue, f *policy.File) (uint64, error) {
	data, err := policy.Encode(f)
	if err != nil {
		return 0, err
	}
	rev, err := kv.Put(ctx, policy.ShadowKey, data)
	if err != nil {
		return 0, fmt.Errorf("policy: put %s %s: %w", kv.Bucket(), policy.ShadowKey, err)
	}
	return rev, nil
}

// ClearShadow drops the shadow policy (a delete: its history stays);
// nothing to drop is no error.
func ClearShadow(ctx context.Context, kv jetstream.KeyValue) error {
	if err := kv.Delete(ctx, policy.ShadowKey); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("policy: delete %s %s: %w", kv.Bucket(), policy.ShadowKey, err)
	}
	return nil
}

// Shadow is the shadow policy and its revision; nil and 0 when there is
// none.
func Shadow(ctx context.Context, kv jetstream.KeyValue) (*policy.File, uint64, error) {
	e, err := kv.Get(ctx, policy.ShadowKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("policy: %s %s: %w", kv.Bucket(), policy.ShadowKey, err)
	}
	f, err := policy.Decode(e.Value())
	return f, e.Revision(), err
}

// Promote makes the shadow policy the policy in force, as a new revision
// of it — only if the revision in force is still the one read, so a
// change made meanwhile is never overwritten — then drops the shadow. It
// returns the new revision.
func Promote(ctx context.Context, kv jetstream.KeyValue) (uint64, error) {
	f, _, err := Shadow(ctx, kv)
	if err != nil {
		return 0, err
	}
	if f == nil {
		return 0, ErrNoShadow
	}
	cur, err := Current(ctx, kv)
	if err != nil {
		return 0, err
	}
	rev, err := PutAt(ctx, kv, f, cur)
	if err != nil {
		return 0, err
	}
	return rev, ClearShadow(ctx, kv)
}
