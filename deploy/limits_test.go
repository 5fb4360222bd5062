package deploy_test

// The limits of account DISPATCH (deploy/README.md#limits). Each server
// config sets them beside its server's store; these tests check the figures
// against the stores and against what the mesh provisions, and read them
// back from running servers (the hostile suite and the cluster test call
// checkLimitsInForce).

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/internal/testkit/proctest"
	"github.com/dispatchmesh/dispatchmesh/services"
	"github.com/dispatchmesh/dispatchmesh/services/intake"
)

// accountLimits are the limits of account DISPATCH in a server config.
type accountLimits struct {
	// jetstream {}: max_file and max_mem count every replica of a stream;
	// max_consumers is per stream.
	MaxFile, MaxMem, MaxStreams, MaxConsumers int64
	// limits {}: max_subscriptions and max_payload are per connection.
	MaxConnections, MaxSubscriptions, MaxPayload int64
}

// serverConf is what a server config says about storage and connections.
type serverConf struct {
	path string
	// replicas of every stream in this topology (DISPATCH_REPLICAS).
	replicas int64
	// max_file_store, max_memory_store, max_payload, max_connections.
	store, memory, payload, connections int64
	account                             accountLimits
}

// readServerConf parses path as nats-server does (its includes too) and
// reads the figures. The passwords must be set (proctest.SetPasswords).
func readServerConf(t *testing.T, path string, replicas int64) serverConf {
	t.Helper()
	m, err := conf.ParseFile(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	num := func(keys ...string) int64 {
		t.Helper()
		var v any = m
		for _, k := range keys {
			mm, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("%s: no %v", path, keys)
			}
			v = mm[k]
		}
		n, ok := v.(int64)
		if !ok {
			t.Fatalf("%s: %v is %v, not a number", path, keys, v)
		}
		return n
	}
	acc := func(block, key string) int64 { t.Helper(); return num("accounts", services.Stream, block, key) }
	return serverConf{
		path: path, replicas: replicas,
		store: num("jetstream", "max_file_store"), memory: num("jetstream", "max_memory_store"),
		payload: num("max_payload"), connections: num("max_connections"),
		account: accountLimits{
			MaxFile: acc("jetstream", "max_file"), MaxMem: acc("jetstream", "max_mem"),
			MaxStreams: acc("jetstream", "max_streams"), MaxConsumers: acc("jetstream", "max_consumers"),
			MaxConnections: acc("limits", "max_connections"), MaxSubscriptions: acc("limits", "max_subscriptions"),
			MaxPayload: acc("limits", "max_payload"),
		},
	}
}

// provisionedStreams is how many streams services.Provision makes: the
// task, submission, advisory, counter and outcome streams and one per KV
// bucket.
func provisionedStreams() int64 { return 5 + int64(len(services.AllBuckets)) }

func gib(n int64) string { return strconv.FormatFloat(float64(n)/(1<<30), 'f', -1, 64) + "GiB" }

// Every topology bounds its account below its server's store, sized from
// what the mesh provisions: the split of deploy/README.md#limits.
func TestAccountLimits(t *testing.T) {
	proctest.SetPasswords(t)
	confs := []serverConf{
		readServerConf(t, filepath.Join("nats", "single.conf"), 1),
		readServerConf(t, filepath.Join("nats", "cluster", "node-1.conf"), 3),
		readServerConf(t, filepath.Join("k8s", "nats", "nats.conf"), 3),
	}
	// The most intake instances the manifests run: each holds up to
	// intake.DefaultMaxWaits waits and watches, one consumer on one stream
	// and two subscriptions each.
	m := regexp.MustCompile(`(?m)^  replicas: (\d+)$`).FindStringSubmatch(readFile(t, filepath.Join("k8s", "intake.yaml")))
	if m == nil {
		t.Fatal("k8s/intake.yaml: no replicas")
	}
	intakes, _ := strconv.ParseInt(m[1], 10, 64)
	waits := int64(intake.DefaultMaxWaits)

	single := confs[0].account
	for _, c := range confs {
		a := c.account
		t.Logf("%s (R%d): max_file_store %s, account max_file %s (%s a node), max_mem %dMiB of %dMiB, max_streams %d, max_consumers %d a stream, max_connections %d, max_subscriptions %d a connection, max_payload %d",
			c.path, c.replicas, gib(c.store), gib(a.MaxFile), gib(a.MaxFile/c.replicas), a.MaxMem>>20, c.memory>>20,
			a.MaxStreams, a.MaxConsumers, a.MaxConnections, a.MaxSubscriptions, a.MaxPayload)
		// The account's share of a node, every replica counted: it must be
		// refused before the store is full, with a tenth kept back.
		if node := a.MaxFile / c.replicas; node <= 0 || c.store-node < c.store/10 {
			t.Errorf("%s: account max_file %s is %s a node, leaving less than a tenth of max_file_store %s", c.path, gib(a.MaxFile), gib(node), gib(c.store))
		}
		if node := a.MaxMem / c.replicas; a.MaxMem < 0 || node >= c.memory {
			t.Errorf("%s: account max_mem %d is %d a node, not below max_memory_store %d", c.path, a.MaxMem, node, c.memory)
		}
		if a.MaxStreams <= provisionedStreams() {
			t.Errorf("%s: max_streams %d leaves no room beside the %d streams the mesh provisions", c.path, a.MaxStreams, provisionedStreams())
		}
		if a.MaxConsumers < 2*intakes*waits {
			t.Errorf("%s: max_consumers %d is less than twice the %d consumers %d intake instances may hold on one stream", c.path, a.MaxConsumers, intakes*waits, intakes)
		}
		if a.MaxSubscriptions < 2*2*waits {
			t.Errorf("%s: max_subscriptions %d is less than twice the %d subscriptions an intake connection may hold", c.path, a.MaxSubscriptions, 2*waits)
		}
		if a.MaxConnections <= 0 || a.MaxConnections >= c.connections {
			t.Errorf("%s: account max_connections %d must bind before the server's %d", c.path, a.MaxConnections, c.connections)
		}
		if a.MaxPayload != c.payload {
			t.Errorf("%s: account max_payload %d, server max_payload %d: say the same", c.path, a.MaxPayload, c.payload)
		}
		// Only the storage figures depend on the topology.
		if a.MaxStreams != single.MaxStreams || a.MaxConsumers != single.MaxConsumers || a.MaxConnections != single.MaxConnections ||
			a.MaxSubscriptions != single.MaxSubscriptions || a.MaxPayload != single.MaxPayload {
			t.Errorf("%s: account limits %+v differ from single.conf's %+v beyond storage", c.path, a, single)
		}
	}
}

// checkLimitsInForce reads the account's JetStream limits as the user of
// js sees them ($JS.API.INFO) and fails unless they are want's. It returns
// them for the report.
func checkLimitsInForce(ctx context.Context, t *testing.T, js jetstream.JetStream, user string, want accountLimits) jetstream.AccountLimits {
	t.Helper()
	info, err := js.AccountInfo(ctx)
	if err != nil {
		t.Fatalf("$JS.API.INFO as %s: %v", user, err)
	}
	got := info.Limits
	for _, l := range []struct {
		name      string
		got, want int64
	}{
		{"max_file", got.MaxStore, want.MaxFile},
		{"max_mem", got.MaxMemory, want.MaxMem},
		{"max_streams", int64(got.MaxStreams), want.MaxStreams},
		{"max_consumers", int64(got.MaxConsumers), want.MaxConsumers},
	} {
		if l.got != l.want {
			t.Errorf("as %s, account %s %s is %d in force, %d in the config", user, services.Stream, l.name, l.got, l.want)
		}
	}
	return got
}

// limitsReport lists the JetStream limits in force for the test's log.
func limitsReport(user string, l jetstream.AccountLimits) string {
	return fmt.Sprintf("as %s ($JS.API.INFO): max_file %s, max_mem %dMiB, max_streams %d, max_consumers %d a stream",
		user, gib(l.MaxStore), l.MaxMemory>>20, l.MaxStreams, l.MaxConsumers)
}

// probeJetStreamLimits has admin (js) ask for what each JetStream limit of
// the account refuses, and reports it: a stream reserving a byte more than
// max_file, or max_mem (less than the server's store, so only the account
// refuses it), streams past max_streams, consumers past max_consumers on
// one stream. What it made is deleted before it returns.
func probeJetStreamLimits(ctx context.Context, t *testing.T, js jetstream.JetStream, want accountLimits) {
	t.Helper()
	refusedWith := func(err error, code jetstream.ErrorCode) bool {
		var api *jetstream.APIError
		return errors.As(err, &api) && api.ErrorCode == code
	}
	var made []string
	defer func() {
		for _, name := range made {
			if err := js.DeleteStream(ctx, name); err != nil {
				t.Errorf("delete %s: %v", name, err)
			}
		}
	}()
	probe := func(i int, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
		cfg.Name, cfg.Subjects = fmt.Sprintf("LIMIT_PROBE_%d", i), []string{fmt.Sprintf("limit.probe.%d", i)}
		s, err := js.CreateStream(ctx, cfg)
		if err == nil {
			made = append(made, cfg.Name)
		}
		return s, err
	}
	// 10047, 10028: insufficient storage / memory resources.
	if _, err := probe(0, jetstream.StreamConfig{Storage: jetstream.FileStorage, MaxBytes: want.MaxFile + 1}); !refusedWith(err, 10047) {
		t.Errorf("a stream reserving max_file+1 bytes: %v, want refused (10047)", err)
	}
	if _, err := probe(0, jetstream.StreamConfig{Storage: jetstream.MemoryStorage, MaxBytes: want.MaxMem + 1}); !refusedWith(err, 10028) {
		t.Errorf("a memory stream reserving max_mem+1 bytes: %v, want refused (10028)", err)
	}
	streams := int64(0)
	for names := js.StreamNames(ctx); ; {
		if _, ok := <-names.Name(); !ok {
			if err := names.Err(); err != nil {
				t.Fatal(err)
			}
			break
		}
		streams++
	}
	// 10027: maximum number of streams reached.
	var last error
	var s jetstream.Stream
	for i := 1; streams <= want.MaxStreams; i++ {
		next, err := probe(i, jetstream.StreamConfig{Storage: jetstream.MemoryStorage, MaxBytes: 1 << 20})
		if last = err; err != nil {
			break
		}
		s = next
		streams++
	}
	if streams != want.MaxStreams || !refusedWith(last, 10027) || s == nil {
		t.Fatalf("stream %d of the account: %v, want refused at max_streams %d (10027)", streams+1, last, want.MaxStreams)
	}
	// 10026: maximum consumers limit reached, on the last probe stream.
	var consumers int64
	for consumers <= want.MaxConsumers {
		if _, last = s.CreateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy, MemoryStorage: true, InactiveThreshold: time.Minute}); last != nil {
			break
		}
		consumers++
	}
	if consumers != want.MaxConsumers || !errors.Is(last, jetstream.ErrMaximumConsumersLimit) {
		t.Errorf("consumer %d of one stream: %v, want refused at max_consumers %d", consumers+1, last, want.MaxConsumers)
	}
	t.Logf("refused as admin: a stream of max_file+1 and one of max_mem+1 bytes, stream %d of the account, consumer %d of one stream", want.MaxStreams+1, want.MaxConsumers+1)
}
