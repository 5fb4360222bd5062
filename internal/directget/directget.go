// Package directget reads the messages a stream keeps on one subject (or a
// wildcard) in one request: JetStream's batch direct get (nats-server ≥
// 2.11, a stream with AllowDirect), answered as one message per stored
// message and an end-of-batch status.
//
// nats.go has no call for it; github.com/synadia-io/orbit.go/jetstreamext
// has one that subscribes and unsubscribes an inbox per request. A Getter
// instead keeps one wildcard subscription per connection for all its
// requests (as nats.go's request mux does for single replies), so a read on
// the hot path costs the server one request and its answers, and never a
// change to its subscription list.
package directget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

// ErrNoStream is returned when nothing answers the request: the stream
// does not exist, or does not allow direct gets.
var ErrNoStream = errors.New("directget: no stream answers direct gets")

// Msg is one stored message: its subject, stream sequence and body.
type Msg struct {
	Subject  string
	Sequence uint64
	Data     []byte
}

// Getter makes batch direct gets on one connection.
type Getter struct {
	nc     *nats.Conn
	prefix string // the JetStream API prefix, "$JS.API."
	inbox  string

	once sync.Once
	err  error
	sub  *nats.Subscription

	mu      sync.Mutex
	waiting map[string]chan *nats.Msg
}

// New returns a Getter on nc using the default JetStream API prefix. Its
// subscription (on an inbox under nc's inbox prefix) is made on first use.
func New(nc *nats.Conn) *Getter {
	return &Getter{nc: nc, prefix: "$JS.API.", inbox: nc.NewInbox(), waiting: map[string]chan *nats.Msg{}}
}

// Close removes the Getter's subscription.
func (g *Getter) Close() error {
	g.mu.Lock()
	sub := g.sub
	g.mu.Unlock()
	if sub == nil {
		return nil
	}
	return sub.Unsubscribe()
}

func (g *Getter) subscribe() error {
	g.once.Do(func() {
		sub, err := g.nc.Subscribe(g.inbox+".*", g.deliver)
		if err != nil {
			g.err = fmt.Errorf("directget: subscribe: %w", err)
			return
		}
		_ = sub.SetPendingLimits(-1, -1)
		g.mu.Lock()
		g.sub = sub
		g.mu.Unlock()
	})
	return g.err
}

func (g *Getter) deliver(m *nats.Msg) {
	token := m.Subject[len(g.inbox)+1:]
	g.mu.Lock()
	ch := g.waiting[token]
	g.mu.Unlock()
	if ch != nil {
		ch <- m // buffered for the whole batch and its status
	}
}

// request is the body of a batch direct get.
type request struct {
	Seq     uint64 `json:"seq,omitempty"`
	NextFor string `json:"next_by_subj"`
	Batch   int    `json:"batch"`
}

// Subject returns the messages stream keeps on filter (a subject, wildcards
// allowed), oldest first, at most max of them: a stream keeping at most n
// messages per subject answers every one of a subject's with max ≥ n.
func (g *Getter) Subject(ctx context.Context, stream, filter string, max int) ([]Msg, error) {
	if max < 1 {
		return nil, fmt.Errorf("directget: batch of %d", max)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("directget: %s %s: %w", stream, filter, err)
	}
	if err := g.subscribe(); err != nil {
		return nil, err
	}
	body, err := json.Marshal(request{Seq: 1, NextFor: filter, Batch: max})
	if err != nil {
		return nil, err
	}
	token := nuid.Next()
	ch := make(chan *nats.Msg, max+2)
	g.mu.Lock()
	g.waiting[token] = ch
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.waiting, token)
		g.mu.Unlock()
	}()
	if err := g.nc.PublishRequest(g.prefix+"DIRECT.GET."+stream, g.inbox+"."+token, body); err != nil {
		return nil, fmt.Errorf("directget: %s: %w", stream, err)
	}
	var out []Msg
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("directget: %s %s: %w", stream, filter, ctx.Err())
		case m := <-ch:
			status := m.Header.Get("Status")
			switch {
			case m.Header.Get("Nats-Sequence") != "": // a stored message
				seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
				if err != nil {
					return nil, fmt.Errorf("directget: %s: answer without a sequence", stream)
				}
				out = append(out, Msg{Subject: m.Header.Get("Nats-Subject"), Sequence: seq, Data: m.Data})
			case status == "204", status == "404": // end of the batch; nothing stored
				return out, nil
			case status == "503":
				return nil, fmt.Errorf("%w: %s", ErrNoStream, stream)
			default:
				return nil, fmt.Errorf("directget: %s %s: status %s %s", stream, filter, status, m.Header.Get("Description"))
			}
			if len(out) > max {
				return nil, fmt.Errorf("directget: %s %s: more than the %d messages asked for", stream, filter, max)
			}
		}
	}
}
