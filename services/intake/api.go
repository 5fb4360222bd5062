package intake

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/runtime/tracing"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// SubmitReply answers a synchronous submit.
type SubmitReply = events.SubmitReply

// Subjects of the request-reply API.
const (
	StatusAPI = events.APIStatus
	WaitAPI   = events.APIWait
)

// API serves dispatch.api.submit, dispatch.api.status, dispatch.api.wait
// and dispatch.api.watch as a micro service (listed by `nats micro ls`). Every answer is JSON; a
// failure is an events.ErrorReply whose code and message are also in the
// micro error headers. Invalid submissions are answered with code 400 and
// the problems, and kept on dispatch.review.rejected.
//
// Requests are served concurrently, each on a goroutine of its own, within
// the bounds below (admit.go); past one a request is answered 503 at once.
type API struct {
	JS    jetstream.JetStream
	Tasks *services.TaskStore
	// Policy names the types KnownTypesOnly accepts.
	Policy *policy.Source
	// KnownTypesOnly answers a submission whose type Policy does not name
	// with 400, and keeps it on dispatch.review.rejected, as intake's
	// Config.KnownTypesOnly rejects it. Default false: any well-formed type.
	KnownTypesOnly bool
	// MaxRequests bounds the submit and status requests this instance
	// serves at once; more are answered 503 (busy). Default
	// DefaultMaxRequests.
	MaxRequests int
	// MaxWaits bounds the waits (and watches) this instance holds at
	// once; more are answered 503. Default DefaultMaxWaits.
	MaxWaits int
	// MaxClientWaits bounds the waits and watches one client holds at once
	// on this instance (a client: ClientOf its reply subject); more are
	// answered 503. Default DefaultMaxClientWaits.
	MaxClientWaits int
	// Log receives what a watch's follower noticed (a forged delivery),
	// dropped requests, unsent answers and panics. Default slog.Default().
	Log *slog.Logger

	mu       sync.Mutex
	nc       *nats.Conn       // where answers are published: Start's
	stream   jetstream.Stream // the task stream, bound on first use
	submits  jetstream.Stream // the submissions' stream, bound on first use
	ctx      context.Context  // ends the waits in progress on Stop
	stop     context.CancelFunc
	requests int            // submit and status requests in progress
	waiting  int            // waits and watches held
	clients  map[string]int // waits and watches held, per client
	load     map[string]*EndpointLoad
	inflight sync.WaitGroup // every request admitted and not yet answered
}

// Start registers the micro service on nc. Call Stop after the service's own
// Stop to end the waits in progress and let the other requests finish.
func (a *API) Start(nc *nats.Conn, version string) (micro.Service, error) {
	a.mu.Lock()
	a.nc = nc
	a.ctx, a.stop = context.WithCancel(context.Background())
	a.mu.Unlock()
	svc, err := micro.AddService(nc, micro.Config{
		Name:        services.MicroService,
		Version:     version,
		Description: "dispatchmesh: synchronous task submit, status, wait and watch",
		// Each endpoint's STATS carry its load: in flight, refused by
		// reason, errors by code (`nats micro stats dispatch`).
		StatsHandler: a.statsData,
	})
	if err != nil {
		return nil, err
	}
	for _, e := range []struct {
		name, subject string
		handler       micro.HandlerFunc
	}{
		{"submit", events.SubmitAPI, a.serve("submit", a.submit)},
		{"status", StatusAPI, a.serve("status", a.status)},
		{"wait", WaitAPI, a.hold("wait", a.wait)},
		{"watch", events.APIWatch, a.hold("watch", a.watch)},
	} {
		if err := svc.AddEndpoint(e.name, e.handler, micro.WithEndpointSubject(e.subject)); err != nil {
			_ = svc.Stop()
			return nil, err
		}
	}
	return svc, nil
}

// inbox reports whether req may be served: its reply subject is an inbox
// (_INBOX.…). The server checks no permission on a reply subject: a
// requester naming $KV.dispatch_tasks.<id> or dispatch.task.<id>.verified
// as its reply would have intake publish its answer there, with intake's
// grants. Such a request is dropped unanswered (there is nowhere safe to
// answer) and logged.
func (a *API) inbox(req micro.Request) bool {
	if strings.HasPrefix(req.Reply(), "_INBOX.") {
		return true
	}
	a.log().Warn("API request with a reply subject outside _INBOX. dropped", "subject", req.Subject(), "reply", req.Reply())
	return false
}

// Stop stops admitting requests (503: ask again, another instance may
// answer), answers the waits and watches in progress with 503, and returns
// once every request admitted has been answered: a submit or status in
// progress finishes (within its own timeout, 10s at most). It may be
// called more than once, and concurrently.
func (a *API) Stop() {
	a.mu.Lock()
	if a.stop != nil {
		a.stop()
	}
	a.mu.Unlock()
	a.inflight.Wait()
}

func (a *API) log() *slog.Logger {
	if a.Log == nil {
		return slog.Default()
	}
	return a.Log
}

// request is one API request, detached from the micro.Request it came
// in: it is answered from the goroutine that serves it, by publishing on
// the API's connection to its reply subject. (A micro.Request's own
// Respond records its outcome for micro's stats, which micro reads as soon
// as the handler returns: from another goroutine, a data race.)
type request struct {
	endpoint string
	data     []byte
	reply    string
	// header is the request's: a submit's traceparent is carried on.
	header   nats.Header
	answered bool
}

// answer sends v, or err as an events.ErrorReply with the micro error
// headers (code and message), to r's reply subject.
func (a *API) answer(r *request, v any, err error) {
	r.answered = true
	msg := nats.NewMsg(r.reply)
	if err == nil {
		if msg.Data, err = json.Marshal(v); err != nil {
			err = fmt.Errorf("encode the answer: %w", err)
		}
	}
	if err != nil {
		ae := apiError(err)
		a.counted(r.endpoint, ae.Code)
		body, merr := json.Marshal(events.ErrorReply{Error: ae})
		if merr != nil {
			body = nil
		}
		// A header value is one line.
		desc := strings.NewReplacer("\r", " ", "\n", " ").Replace(ae.Message)
		if desc == "" {
			desc = "error"
		}
		msg.Header.Set(micro.ErrorHeader, desc)
		msg.Header.Set(micro.ErrorCodeHeader, strconv.Itoa(ae.Code))
		msg.Data = body
	}
	a.send(r, msg)
}

// send publishes msg (its subject r's reply) on the API's connection.
func (a *API) send(r *request, msg *nats.Msg) {
	if err := a.conn().PublishMsg(msg); err != nil {
		a.log().Warn("API answer not sent", "endpoint", r.endpoint, "reply", r.reply, "err", err)
	}
}

// conn is the connection answers go out on: Start's.
func (a *API) conn() *nats.Conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.nc == nil {
		return a.JS.Conn()
	}
	return a.nc
}

// apiError is err as an API error: an *events.APIError as it is, an
// invalid task as a 400 with its problems, anything else a 500.
func apiError(err error) *events.APIError {
	var ae *events.APIError
	if errors.As(err, &ae) {
		return ae
	}
	var inv *events.InvalidError
	if errors.As(err, &inv) {
		return events.NewAPIError(events.CodeBadRequest, err.Error(), inv.Problems...)
	}
	return events.NewAPIError(events.CodeInternal, err.Error())
}

// submitTimeout and statusTimeout bound one request's reads and writes.
// Stop does not cut them short: a request admitted is answered.
const (
	submitTimeout = 10 * time.Second
	statusTimeout = 5 * time.Second
)

func (a *API) submit(r *request) {
	ctx, cancel := context.WithTimeout(context.Background(), submitTimeout)
	defer cancel()
	reply, err := a.Submit(tracing.Extract(ctx, r.header), r.data)
	a.answer(r, reply, err)
}

// Submit validates data and queues it for intake. Invalid input (and,
// with KnownTypesOnly, a type the policy does not name) returns an
// *events.InvalidError and is kept on the review subject. The submission
// carries ctx's trace context (traceparent), when it has one: intake's
// span continues the submitter's trace.
func (a *API) Submit(ctx context.Context, data []byte) (SubmitReply, error) {
	sub, err := events.DecodeSubmit(data, "")
	if err == nil {
		err = knownType(a.KnownTypesOnly, a.Policy.Snapshot(), sub.Type)
	}
	if err != nil {
		if kerr := a.keepRejected(ctx, data, sub.ID, err); kerr != nil {
			return SubmitReply{}, errors.Join(err, kerr)
		}
		return SubmitReply{}, err
	}
	if sub.ID == "" {
		sub.ID = nuid.Next()
	}
	switch st, err := a.Tasks.Get(ctx, sub.ID); {
	case err == nil:
		if err := a.sameTask(ctx, st, sub); err != nil {
			return SubmitReply{}, err
		}
		return SubmitReply{ID: sub.ID, Duplicate: true}, nil
	case !errors.Is(err, services.ErrTaskNotFound):
		return SubmitReply{}, err
	}
	body, err := json.Marshal(sub)
	if err != nil {
		return SubmitReply{}, err
	}
	subject := events.SubmitSubject(sub.Type)
	ack, err := a.JS.PublishMsg(ctx, submission(ctx, subject, body), jetstream.WithMsgID(submitMsgID(sub.ID, body)))
	if err != nil {
		return SubmitReply{}, fmt.Errorf("queue task: %w", err)
	}
	if ack.Duplicate {
		// Clients choose their Msg-Ids on the submissions' stream too:
		// believe the duplicate only if what is stored is this submission.
		same, err := a.stored(ctx, ack, subject, body)
		if err != nil {
			return SubmitReply{}, fmt.Errorf("queue task: %w", err)
		}
		if !same {
			ack, err = a.JS.PublishMsg(ctx, submission(ctx, subject, body), jetstream.WithMsgID(submitMsgID(sub.ID, body)+":"+nuid.Next()))
			if err != nil {
				return SubmitReply{}, fmt.Errorf("queue task: %w", err)
			}
		}
	}
	return SubmitReply{ID: sub.ID, Duplicate: ack.Duplicate}, nil
}

// submission is the message queuing body on subject, carrying ctx's trace
// context.
func submission(ctx context.Context, subject string, body []byte) *nats.Msg {
	m := &nats.Msg{Subject: subject, Data: body}
	if trace.SpanContextFromContext(ctx).IsValid() {
		m.Header = nats.Header{}
		tracing.Inject(ctx, m.Header)
	}
	return m
}

// sameTask returns nil when sub, submitted again under the id of the task
// in state st, is the task as it was submitted (Resubmitted), else the 409
// (events.CodeConflict) naming what differs.
func (a *API) sameTask(ctx context.Context, st events.TaskState, sub events.Submit) error {
	s, err := a.bind(ctx, services.SubmitStream, &a.submits)
	if err != nil {
		return err
	}
	diff, err := Resubmitted(ctx, s, st, sub)
	if err != nil || len(diff) == 0 {
		return err
	}
	return events.NewAPIError(events.CodeConflict, conflict(st.ID, diff), diff...)
}

// conflict says that task id exists with another body.
func conflict(id string, diff []string) string {
	return fmt.Sprintf("task %s exists and was submitted with another body (%s): nothing was queued; submit the same body again, or this one under another id",
		id, strings.Join(diff, "; "))
}

// Resubmitted compares sub, submitted again under the id of the task in
// state st, with the submission that created the task, read from the
// submissions' stream s at st.SubmitSeq, and names what differs
// (events.Submit.Differences: the submitted fields, normalised); none,
// the same task. Once that submission is gone (older than the stream's
// MaxAge, like the task's events), the type, subject and callback URL the
// state keeps are compared, the rest taken as the same. The API answers a difference
// with 409, the intake stage files it as a rejection.
func Resubmitted(ctx context.Context, s jetstream.Stream, st events.TaskState, sub events.Submit) ([]string, error) {
	stored := events.Submit{ID: st.ID, Type: st.Type, Subject: st.Subject, CallbackURL: st.CallbackURL}
	partial := true
	if st.SubmitSeq > 0 {
		switch raw, err := s.GetMsg(ctx, st.SubmitSeq); {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return nil, fmt.Errorf("read the submission of task %s (%s#%d): %w", st.ID, services.SubmitStream, st.SubmitSeq, err)
		default:
			if orig, err := events.DecodeSubmitFrom(raw.Subject, raw.Data); err == nil && (orig.ID == st.ID || orig.ID == "") {
				stored, partial = orig, false
			}
		}
	}
	if partial {
		sub = events.Submit{ID: sub.ID, Type: sub.Type, Subject: sub.Subject, CallbackURL: sub.CallbackURL}
	}
	return stored.Differences(sub), nil
}

// submitMsgID is the Msg-Id the API queues a submission under: the same
// id and body twice within the window are stored once.
func submitMsgID(id string, body []byte) string {
	sum := sha256.Sum256(body)
	return "submit:" + id + ":" + hex.EncodeToString(sum[:12])
}

// stored reports whether the message the submissions' stream answered ack
// with is the submission published: same subject, same bytes.
func (a *API) stored(ctx context.Context, ack *jetstream.PubAck, subject string, body []byte) (bool, error) {
	s, err := a.bind(ctx, services.SubmitStream, &a.submits)
	if err != nil {
		return false, err
	}
	raw, err := s.GetMsg(ctx, ack.Sequence)
	if err != nil {
		return false, fmt.Errorf("read %s#%d: %w", ack.Stream, ack.Sequence, err)
	}
	return raw.Subject == subject && bytes.Equal(raw.Data, body), nil
}

func (a *API) keepRejected(ctx context.Context, data []byte, id string, cause error) error {
	if !events.ValidID(id) {
		sum := sha256.Sum256(data)
		id = "api-" + hex.EncodeToString(sum[:8])
	}
	msg := nats.NewMsg(events.ReviewSubject(events.ReviewRejected, id))
	msg.Data = services.KeepBody(msg.Header, data)
	msg.Header.Set(events.HeaderEvent, events.EventRejected)
	msg.Header.Set(events.HeaderReason, events.ReviewRejected)
	msg.Header.Set(events.HeaderError, cause.Error())
	msg.Header.Set(events.HeaderOrigSubj, events.SubmitAPI)
	sum := sha256.Sum256(data)
	_, err := a.JS.PublishMsg(ctx, msg, jetstream.WithMsgID("rejected:api:"+hex.EncodeToString(sum[:])))
	return err
}

func (a *API) status(r *request) {
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	st, err := a.Status(ctx, r.data)
	a.answer(r, st, err)
}

// Status answers a status request (a bare id or {"id": …}): the task's
// state; for an id without a task, its rejection (events.CodeRejected)
// when one is kept, else events.CodeNotFound.
func (a *API) Status(ctx context.Context, data []byte) (events.TaskState, error) {
	r, err := events.DecodeTaskRequest(data)
	if err != nil {
		return events.TaskState{}, err
	}
	st, err := a.Tasks.Get(ctx, r.ID)
	if errors.Is(err, services.ErrTaskNotFound) {
		if err := a.storedRejection(ctx, r.ID); err != nil {
			return st, err
		}
		return st, events.NewAPIError(events.CodeNotFound, "task "+r.ID+" not found")
	}
	return st, err
}

// storedRejection returns the CodeRejected error of the last submission
// of id that was rejected, nil when none is kept.
func (a *API) storedRejection(ctx context.Context, id string) error {
	msg, err := a.lastMsg(ctx, events.ReviewSubject(events.ReviewRejected, id))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil
	case err != nil:
		return err
	}
	return rejection(id, msg.Header, msg.Data)
}

// rejection says why the submission of id kept with header h and its
// original bytes was rejected. The problems are found again by decoding the
// original as intake did; the kept error text stands in when that finds none.
func rejection(id string, h nats.Header, original []byte) *events.APIError {
	reason := h.Get(events.HeaderError)
	// Submitted on dispatch.submit.<type>: the type token counts; through
	// the API (or anywhere else): it does not.
	subjectType, ok := strings.CutPrefix(h.Get(events.HeaderOrigSubj), events.SubmitRoot+".")
	if !ok {
		subjectType = ""
	}
	var problems []string
	var inv *events.InvalidError
	if _, err := events.DecodeSubmit(original, subjectType); errors.As(err, &inv) {
		problems = inv.Problems
	} else if reason != "" {
		problems = []string{reason}
	}
	if reason == "" {
		reason = "invalid task"
	}
	return events.NewAPIError(events.CodeRejected,
		fmt.Sprintf("task %s was rejected when submitted and never ran (%s): %s", id, events.ReviewSubject(events.ReviewRejected, id), reason),
		problems...)
}

// lastMsg is the last message stored on subject in the task stream.
func (a *API) lastMsg(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	stream, err := a.bind(ctx, services.Stream, &a.stream)
	if err != nil {
		return nil, err
	}
	return stream.GetLastMsgForSubject(ctx, subject)
}

// bind returns *held, binding the named stream on first use.
func (a *API) bind(ctx context.Context, name string, held *jetstream.Stream) (jetstream.Stream, error) {
	a.mu.Lock()
	stream := *held
	a.mu.Unlock()
	if stream != nil {
		return stream, nil
	}
	s, err := a.JS.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	a.mu.Lock()
	*held = s
	a.mu.Unlock()
	return s, nil
}
