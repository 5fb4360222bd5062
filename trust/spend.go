package trust

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// SpendRoot prefixes the subjects of the spend counters: one server-side
// counter (a stream with AllowMsgCounter, nats-server ≥ 2.12) per task type,
// UTC day and unit — dispatch.count.<type>.tokens.<day> and
// dispatch.count.<type>.nanousd.<day>.
const SpendRoot = "dispatch.count"

// Spend counter units.
const (
	unitTokens  = "tokens"
	unitNanoUSD = "nanousd"
)

// SpendSubject is the counter subject of taskType's spend in unit on day
// ("2006-01-02").
func SpendSubject(taskType, unit, day string) string {
	return fmt.Sprintf("%s.%s.%s.%s", SpendRoot, taskType, unit, day)
}

// Spending keeps what each task type spent per UTC day in server-side
// counters. Every increment carries the outcome's key as its Nats-Msg-Id, so
// an outcome recorded again — a recorder killed after its update and before
// its ack, redelivered later — is deduplicated by the stream and counted
// once, however many outcomes came in between.
type Spending struct {
	js     jetstream.JetStream
	stream string

	mu    sync.Mutex
	bound jetstream.Stream // bound on first read
}

// NewSpending returns the spend counters kept on stream.
func NewSpending(js jetstream.JetStream, stream string) *Spending {
	return &Spending{js: js, stream: stream}
}

// SpendMsgs are the increments that count what the outcome with key spent
// on at's UTC day: one per unit that is not zero, each with the outcome's
// key in its Nats-Msg-Id, so the counter stream counts the outcome once
// however often it is published. The recorder publishes them with the
// outcome.
func SpendMsgs(taskType, key string, at time.Time, tokens int, cost float64) ([]*nats.Msg, error) {
	if !events.ValidType(taskType) || key == "" {
		return nil, fmt.Errorf("%w: spend of type %q with key %q", ErrInvalid, taskType, key)
	}
	day := Day(at)
	var msgs []*nats.Msg
	for _, c := range []struct {
		unit string
		n    int64
	}{{unitTokens, int64(tokens)}, {unitNanoUSD, nanoUSD(cost)}} {
		if c.n == 0 {
			continue
		}
		m := incrMsg(SpendSubject(taskType, c.unit, day), c.n)
		m.Header.Set(nats.MsgIdHdr, key+":"+c.unit)
		msgs = append(msgs, m)
	}
	return msgs, nil
}

// Add counts what the outcome with key spent on at's UTC day (SpendMsgs),
// both increments in flight together.
func (s *Spending) Add(ctx context.Context, taskType, key string, at time.Time, tokens int, cost float64) error {
	msgs, err := SpendMsgs(taskType, key, at, tokens, cost)
	if err != nil {
		return err
	}
	var acks []jetstream.PubAckFuture
	for _, m := range msgs {
		f, err := s.js.PublishMsgAsync(m)
		if err != nil {
			return fmt.Errorf("trust: count spend of %s: %w", taskType, err)
		}
		acks = append(acks, f)
	}
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("trust: count %s: %w", f.Msg().Subject, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func incrMsg(subject string, n int64) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set("Nats-Incr", strconv.FormatInt(n, 10))
	return m
}

func (s *Spending) incr(ctx context.Context, subject string, n int64) error {
	if _, err := s.js.PublishMsg(ctx, incrMsg(subject, n)); err != nil {
		return fmt.Errorf("trust: count %s: %w", subject, err)
	}
	return nil
}

// On is what taskType spent on at's UTC day.
func (s *Spending) On(ctx context.Context, taskType string, at time.Time) (Spend, error) {
	return s.Day(ctx, taskType, Day(at))
}

// Day is what taskType spent on day ("2006-01-02").
func (s *Spending) Day(ctx context.Context, taskType, day string) (Spend, error) {
	tokens, err := s.value(ctx, SpendSubject(taskType, unitTokens, day))
	if err != nil {
		return Spend{}, err
	}
	nano, err := s.value(ctx, SpendSubject(taskType, unitNanoUSD, day))
	if err != nil {
		return Spend{}, err
	}
	return Spend{Tokens: int(tokens), Cost: float64(nano) / 1e9}, nil
}

// value reads a counter; 0 when it was never incremented.
func (s *Spending) value(ctx context.Context, subject string) (int64, error) {
	stream, err := s.bind(ctx)
	if err != nil {
		return 0, err
	}
	raw, err := stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("trust: read %s: %w", subject, err)
	}
	var v struct {
		Val string `json:"val"`
	}
	if err := json.Unmarshal(raw.Data, &v); err != nil {
		return 0, fmt.Errorf("trust: counter %s: %w", subject, err)
	}
	n, err := strconv.ParseInt(v.Val, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("trust: counter %s: %w", subject, err)
	}
	return n, nil
}

func (s *Spending) bind(ctx context.Context) (jetstream.Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bound == nil {
		st, err := s.js.Stream(ctx, s.stream)
		if err != nil {
			return nil, fmt.Errorf("trust: spend counters %s: %w", s.stream, err)
		}
		s.bound = st
	}
	return s.bound, nil
}

// NanoUSD is cost in whole billionths of a dollar, as the counters keep it
// (they are integers).
func NanoUSD(cost float64) int64 { return int64(math.Round(cost * 1e9)) }

func nanoUSD(cost float64) int64 { return NanoUSD(cost) }

// DaySpend is one type's spend counters for one UTC day.
type DaySpend struct {
	Type, Day string
	Tokens    int64
	NanoUSD   int64
}

// All returns every type's spend counters, per day.
func (s *Spending) All(ctx context.Context) (map[[2]string]DaySpend, error) {
	stream, err := s.bind(ctx)
	if err != nil {
		return nil, err
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(SpendRoot+".>"))
	if err != nil {
		return nil, fmt.Errorf("trust: spend counters: %w", err)
	}
	all := map[[2]string]DaySpend{}
	for subject := range info.State.Subjects {
		var taskType, unit, day string
		if _, err := fmt.Sscanf(strings.ReplaceAll(strings.TrimPrefix(subject, SpendRoot+"."), ".", " "), "%s %s %s", &taskType, &unit, &day); err != nil {
			continue // not a spend counter
		}
		n, err := s.value(ctx, subject)
		if err != nil {
			return nil, err
		}
		k := [2]string{taskType, day}
		d := all[k]
		d.Type, d.Day = taskType, day
		switch unit {
		case unitTokens:
			d.Tokens = n
		case unitNanoUSD:
			d.NanoUSD = n
		}
		all[k] = d
	}
	return all, nil
}

// CorrectTo sets taskType's counters of day to want by adding the
// difference (dispatch rebuild -apply).
func (s *Spending) CorrectTo(ctx context.Context, have, want DaySpend) error {
	for _, c := range []struct {
		unit string
		n    int64
	}{{unitTokens, want.Tokens - have.Tokens}, {unitNanoUSD, want.NanoUSD - have.NanoUSD}} {
		if c.n != 0 {
			if err := s.incr(ctx, SpendSubject(want.Type, c.unit, want.Day), c.n); err != nil {
				return err
			}
		}
	}
	return nil
}
