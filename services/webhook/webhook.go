// Package webhook delivers the wait answer of a settled task to the
// callback URL it names, signed, at least once: one consumer files a
// delivery due (dispatch.webhook.due.<id>) for each settlement it sees in
// the task-state bucket's stream, another delivers each due one with
// capped exponential backoff and jitter — NakWithDelay on JetStream, so
// the tries outlive the process — and gives it up after its last try with
// a review record (dispatch.review.webhook.<id>). See docs/api.md#webhooks.
package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// Consumer names: the settlements seen, the deliveries made.
const (
	ConsumerSettle  = "webhook_settle"
	ConsumerDeliver = "webhook"
)

// kvOperation is the header a bucket's stream marks a delete or purge with.
const kvOperation = "KV-Operation"

// Service is the webhook service. Its two consumers (SettleSpec, Spec)
// share it.
type Service struct {
	cfg     Config
	client  *http.Client
	metrics *metrics
	backoff func(n int) time.Duration

	mu     sync.Mutex
	stream jetstream.Stream // the task stream, bound on first use
}

// New checks cfg and makes the service.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, client: newClient(cfg.Timeout, cfg.AllowPrivate), metrics: m,
		backoff: Backoff(cfg.BackoffBase, cfg.BackoffMax, nil)}, nil
}

// SettleSpec is the consumer of every task-state write: a settled task
// with a callback URL gets a delivery due. Created, it starts at the
// stream's end (DeliverNew): the tasks that settled before the service
// first ran are not called back — a type's callback_url added to the
// policy must not call back a month of its tasks — and from then on the
// durable consumer misses none, across restarts and crashes.
func (s *Service) SettleSpec() services.Spec {
	return services.Spec{
		Name: ConsumerSettle, Stream: events.KVStream(services.BucketTasks),
		Filters: []string{"$KV." + services.BucketTasks + ".>"},
		Handler: s.Settle, Concurrency: 4, Prefetch: services.FastPrefetch, DeliverNew: true,
	}
}

// MaxPendingDeliveries is the deliver consumer's MaxAckPending: the
// deliveries it may hold at once, most of them waiting out a backoff.
const MaxPendingDeliveries = 200_000

// Spec is the consumer of the deliveries due: each is tried until the
// receiver accepts it, or MaxAttempts times.
func (s *Service) Spec() services.Spec {
	return services.Spec{
		Name: ConsumerDeliver, Filters: []string{events.WebhookDueSubject("*")},
		Handler: s.Deliver, Concurrency: 16, OnDemand: true,
		// One delivery more than the tries: a try cut short by a crash (or
		// a shutdown) on the last one comes back once more and is given
		// up with its review record, never dropped to an advisory.
		MaxDeliver: s.cfg.MaxAttempts + 1, AckWait: s.cfg.Timeout + 30*time.Second,
		// A delivery waiting out its backoff stays pending: a receiver
		// down for hours must not take every slot from the others.
		MaxAckPending: MaxPendingDeliveries,
		Backoff:       Backoff(s.cfg.BackoffBase, s.cfg.BackoffMax, nil),
	}
}

// Settle files the delivery of a task-state write that settles a task
// with a callback URL (events.Terminal): its wait answer as it is now, under
// the settlement's delivery id, which is also the Msg-Id — a redelivered
// write, or a rebuild's, files it once.
func (s *Service) Settle(ctx context.Context, m *services.Msg) ([]services.Out, error) {
	if m.Header.Get(kvOperation) != "" { // a delete or purge: nothing settled
		return nil, nil
	}
	var st events.TaskState
	if err := json.Unmarshal(m.Data, &st); err != nil {
		return nil, services.Dead(events.ReviewPoison, fmt.Errorf("task state: %w", err))
	}
	url := st.CallbackURL
	if url == "" && s.cfg.Policy != nil {
		url = s.cfg.Policy.For(st.Type).CallbackURL
	}
	if !events.Terminal(st.Status) || url == "" {
		return nil, nil
	}
	stream, err := s.tasks(ctx)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(services.WaitAnswer(ctx, stream, st, false))
	if err != nil {
		return nil, err
	}
	due := events.WebhookDue{DeliveryID: events.WebhookDeliveryID(st), TaskID: st.ID, URL: url,
		Status: st.Status, Body: body, SettledAt: st.UpdatedAt}
	out, err := services.Emit(events.WebhookDueSubject(st.ID), "webhook:"+due.DeliveryID, events.EventWebhookDue, st.ID, due)
	if err != nil {
		return nil, err
	}
	s.metrics.due.Inc()
	return []services.Out{out}, nil
}

// Deliver tries one delivery due. Accepted (2xx): a delivered record. A
// failed try is retried after Backoff (the router's nak with delay); the
// last one, or a URL the service may not call, gives the delivery up with
// a review record that `dispatch webhooks` lists and redelivers.
func (s *Service) Deliver(ctx context.Context, m *services.Msg) ([]services.Out, error) {
	var due events.WebhookDue
	if err := json.Unmarshal(m.Data, &due); err != nil || due.DeliveryID == "" || !events.ValidID(due.TaskID) {
		if err == nil {
			err = errors.New("no delivery id or task id")
		}
		return nil, services.Dead(events.ReviewPoison, fmt.Errorf("webhook due: %w", err))
	}
	err := checkURL(s.cfg.AllowHosts, due.URL)
	code, wait := 0, time.Duration(0)
	switch {
	case err != nil:
	case m.Delivered > s.cfg.MaxAttempts: // its last try was cut short
		err = fmt.Errorf("the last of %d tries was cut short (the service stopped or crashed during it)", s.cfg.MaxAttempts)
	default:
		code, wait, err = s.post(ctx, due, m.Delivered)
	}
	switch {
	case err == nil:
		s.metrics.result(resultDelivered)
		out, err := services.Emit(events.WebhookDeliveredSubject(due.TaskID), "webhook-delivered:"+due.DeliveryID+":"+strconv.FormatUint(m.Seq, 10),
			events.EventWebhookDelivered, due.TaskID, events.WebhookDelivered{DeliveryID: due.DeliveryID, TaskID: due.TaskID, URL: due.URL, Attempt: m.Delivered, Code: code, At: time.Now().UTC()})
		return []services.Out{out}, err
	case ctx.Err() != nil: // stopping: not the receiver's failure, tried again
		return nil, err
	case errors.Is(err, ErrNotAllowed) || m.Delivered >= s.cfg.MaxAttempts:
		s.metrics.result(resultFailed)
		s.cfg.Log.Warn("webhook delivery given up", "task", due.TaskID, "delivery", due.DeliveryID, "attempts", m.Delivered, "err", err)
		out, err := services.Emit(events.ReviewSubject(events.ReviewWebhook, due.TaskID), "webhook-failed:"+due.DeliveryID+":"+strconv.FormatUint(m.Seq, 10),
			events.EventWebhookFailed, due.TaskID, events.WebhookFailed{Due: due, Attempts: m.Delivered, LastError: err.Error(), At: time.Now().UTC()})
		return []services.Out{out}, err
	}
	s.metrics.result(resultRetried)
	return nil, s.retry(ctx, due, m, code, wait, err)
}

// retry records a failed try (dispatch.webhook.try.<id>, what `dispatch
// webhooks` lists as retrying) and snoozes the delivery: the next try after
// the backoff, or after the receiver's Retry-After (at most BackoffMax).
// The record is informational: a failure to store it is logged, and the
// delivery is retried all the same.
func (s *Service) retry(ctx context.Context, due events.WebhookDue, m *services.Msg, code int, wait time.Duration, cause error) error {
	delay := s.backoff(m.Delivered)
	if wait > 0 {
		delay = min(wait, s.cfg.BackoffMax)
	}
	now := time.Now().UTC()
	out, err := services.Emit(events.WebhookTrySubject(due.TaskID),
		"webhook-try:"+due.DeliveryID+":"+strconv.FormatUint(m.Seq, 10)+":"+strconv.Itoa(m.Delivered), events.EventWebhookTry, due.TaskID,
		events.WebhookTry{DeliveryID: due.DeliveryID, TaskID: due.TaskID, URL: due.URL, Attempt: m.Delivered, Code: code,
			Error: cause.Error(), At: now, NextAt: now.Add(delay)})
	if err == nil {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, err = s.cfg.JS.PublishMsg(pctx, services.NatsMsg(out), jetstream.WithMsgID(out.MsgID))
		cancel()
	}
	if err != nil {
		s.cfg.Log.Warn("webhook try not recorded", "task", due.TaskID, "delivery", due.DeliveryID, "err", err)
	}
	return services.Snooze(delay, fmt.Errorf("webhook %s try %d: %w", due.DeliveryID, m.Delivered, cause))
}

// post makes one try: the body signed now. It returns the answer's status
// code and, for a 429 or 503, the wait its Retry-After asks for.
func (s *Service) post(ctx context.Context, due events.WebhookDue, attempt int) (int, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, due.URL, bytes.NewReader(due.Body))
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %v", ErrNotAllowed, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "dispatchmesh-webhook/1")
	req.Header.Set(events.WebhookDeliveryHeader, due.DeliveryID)
	req.Header.Set(events.WebhookTaskHeader, due.TaskID)
	req.Header.Set(events.WebhookAttemptHeader, strconv.Itoa(attempt))
	req.Header.Set(events.WebhookSignatureHeader, events.SignWebhook(s.cfg.Secret, time.Now(), due.DeliveryID, due.Body))
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		var wait time.Duration
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
			wait = RetryAfter(resp.Header.Get("Retry-After"), time.Now())
		}
		return resp.StatusCode, wait, fmt.Errorf("the receiver answered %d", resp.StatusCode)
	}
	return resp.StatusCode, 0, nil
}

// tasks is the task stream, bound on first use (the wait answer reads it).
func (s *Service) tasks(ctx context.Context) (jetstream.Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stream == nil {
		st, err := s.cfg.JS.Stream(ctx, services.Stream)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", services.Stream, err)
		}
		s.stream = st
	}
	return s.stream, nil
}
