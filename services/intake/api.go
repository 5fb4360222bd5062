package intake

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"

	"dispatchmesh/events"
	"dispatchmesh/services"
)

// SubmitReply answers a synchronous submit.
type SubmitReply struct {
	ID string `json:"id"`
	// Duplicate is true when a task with this id already existed: nothing new
	// was queued.
	Duplicate bool `json:"duplicate,omitempty"`
}

// Subjects of the request-reply API.
const (
	StatusAPI = events.Root + ".api.status"
)

// API serves dispatch.api.submit and dispatch.api.status as a micro service
// (listed by `nats micro ls`). Invalid submissions are answered with error
// code 400 and the problems, and kept on dispatch.review.rejected.
type API struct {
	JS    jetstream.JetStream
	Tasks *services.TaskStore
}

// Start registers the micro service on nc.
func (a *API) Start(nc *nats.Conn, version string) (micro.Service, error) {
	svc, err := micro.AddService(nc, micro.Config{
		Name:        services.MicroService,
		Version:     version,
		Description: "dispatchmesh: synchronous task submit and status",
	})
	if err != nil {
		return nil, err
	}
	if err := svc.AddEndpoint("submit", micro.HandlerFunc(a.submit), micro.WithEndpointSubject(events.SubmitAPI)); err != nil {
		return nil, err
	}
	if err := svc.AddEndpoint("status", micro.HandlerFunc(a.status), micro.WithEndpointSubject(StatusAPI)); err != nil {
		return nil, err
	}
	return svc, nil
}

func (a *API) submit(req micro.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reply, err := a.Submit(ctx, req.Data())
	var inv *events.InvalidError
	switch {
	case errors.As(err, &inv):
		_ = req.Error("400", err.Error(), nil)
	case err != nil:
		_ = req.Error("500", err.Error(), nil)
	default:
		_ = req.RespondJSON(reply)
	}
}

// Submit validates data and queues it for intake. Invalid input returns an
// *events.InvalidError and is kept on the review subject.
func (a *API) Submit(ctx context.Context, data []byte) (SubmitReply, error) {
	sub, err := events.DecodeSubmit(data, "")
	if err != nil {
		if kerr := a.keepRejected(ctx, data, sub.ID, err); kerr != nil {
			return SubmitReply{}, errors.Join(err, kerr)
		}
		return SubmitReply{}, err
	}
	if sub.ID == "" {
		sub.ID = nuid.Next()
	}
	switch _, err := a.Tasks.Get(ctx, sub.ID); {
	case err == nil:
		return SubmitReply{ID: sub.ID, Duplicate: true}, nil
	case !errors.Is(err, services.ErrTaskNotFound):
		return SubmitReply{}, err
	}
	body, err := json.Marshal(sub)
	if err != nil {
		return SubmitReply{}, err
	}
	ack, err := a.JS.Publish(ctx, events.SubmitSubject(sub.Type), body, jetstream.WithMsgID("submit:"+sub.ID))
	if err != nil {
		return SubmitReply{}, fmt.Errorf("queue task: %w", err)
	}
	return SubmitReply{ID: sub.ID, Duplicate: ack.Duplicate}, nil
}

func (a *API) keepRejected(ctx context.Context, data []byte, id string, cause error) error {
	if !events.ValidID(id) {
		sum := sha256.Sum256(data)
		id = "api-" + hex.EncodeToString(sum[:8])
	}
	msg := nats.NewMsg(events.ReviewSubject(events.ReviewRejected, id))
	msg.Data = data
	msg.Header.Set(events.HeaderEvent, events.EventRejected)
	msg.Header.Set(events.HeaderReason, events.ReviewRejected)
	msg.Header.Set(events.HeaderError, cause.Error())
	msg.Header.Set(events.HeaderOrigSubj, events.SubmitAPI)
	sum := sha256.Sum256(data)
	_, err := a.JS.PublishMsg(ctx, msg, jetstream.WithMsgID("rejected:api:"+hex.EncodeToString(sum[:])))
	return err
}

func (a *API) status(req micro.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	id := string(req.Data())
	if !events.ValidID(id) {
		_ = req.Error("400", fmt.Sprintf("invalid task id %q", id), nil)
		return
	}
	st, err := a.Tasks.Get(ctx, id)
	switch {
	case errors.Is(err, services.ErrTaskNotFound):
		_ = req.Error("404", "task "+id+" not found", nil)
	case err != nil:
		_ = req.Error("500", err.Error(), nil)
	default:
		_ = req.RespondJSON(st)
	}
}
