package faults

import (
	"context"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// checkedStreams are the streams Check reads, the KV buckets' included.
var checkedStreams = []string{
	services.Stream, services.SubmitStream, services.OutcomeStream, services.CounterStream,
	events.KVStream(services.BucketTasks), events.KVStream(services.BucketHistory), events.KVStream(services.BucketHeld), events.KVStream(services.BucketTrust),
}

// fingerprint is the last sequence of each stream Check reads: equal
// before and after a read, nothing moved while it read.
func fingerprint(ctx context.Context, js jetstream.JetStream) (map[string]uint64, error) {
	out := make(map[string]uint64, len(checkedStreams))
	for _, name := range checkedStreams {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("check: stream %s: %w", name, err)
		}
		out[name] = s.CachedInfo().State.LastSeq
	}
	return out, nil
}

// moved names the streams whose last sequence differs; "" when none does.
func moved(before, after map[string]uint64) string {
	var names []string
	for _, name := range checkedStreams {
		if before[name] != after[name] {
			names = append(names, fmt.Sprintf("%s %d→%d", name, before[name], after[name]))
		}
	}
	return strings.Join(names, ", ")
}
