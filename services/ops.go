package services

import (
	"encoding/json"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// OpsName is the micro service every process registers for each service it
// runs, so `nats micro ls` lists them all: dispatch-<service>
// (dispatch-verifier, dispatch-web, …). The request-reply API of intake is
// MicroService ("dispatch") beside it.
func OpsName(service string) string { return MicroService + "-" + service }

// HealthSubject is the endpoint of service's micro service that answers
// its OpsStatus: dispatch.health.<service>. The stream does not capture it.
func HealthSubject(service string) string { return "dispatch.health." + service }

// OpsStatus is what a service's micro service reports, as its health
// endpoint's answer and as that endpoint's data in $SRV.STATS.
type OpsStatus struct {
	Service  string `json:"service"`
	Instance string `json:"instance"`
	// Ready is the service's readiness; Reason says why not.
	Ready  bool   `json:"ready"`
	Reason string `json:"reason,omitempty"`
	RunCounts
}

// OpsConfig describes the micro service of one service.
type OpsConfig struct {
	// Service is the service's name (intake, verifier, …, web).
	Service     string
	Version     string
	Description string
	// Instance names the process (host:pid); in the service's metadata.
	Instance string
	// Metadata is added to the service's metadata (consumer, stream, …).
	Metadata map[string]string
	// Counts reads the service's counters. Default: none.
	Counts func() RunCounts
	// Ready reports why the service is not ready (nil: ready). Default: ready.
	Ready func() error
}

// Status is the service's OpsStatus now.
func (c OpsConfig) Status() OpsStatus {
	st := OpsStatus{Service: c.Service, Instance: c.Instance, Ready: true}
	if c.Counts != nil {
		st.RunCounts = c.Counts()
	}
	if c.Ready != nil {
		if err := c.Ready(); err != nil {
			st.Ready, st.Reason = false, err.Error()
		}
	}
	return st
}

// StartOps registers the micro service OpsName(c.Service) on nc, with one
// endpoint, "health" on HealthSubject(c.Service), answering c.Status();
// $SRV.STATS carries the same status as the endpoint's data. Stop the
// returned service when the service stops.
func StartOps(nc *nats.Conn, c OpsConfig) (micro.Service, error) {
	md := map[string]string{"service": c.Service, "instance": c.Instance}
	for k, v := range c.Metadata {
		md[k] = v
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name: OpsName(c.Service), Version: c.Version, Description: c.Description, Metadata: md,
		StatsHandler: func(*micro.Endpoint) any { return c.Status() },
	})
	if err != nil {
		return nil, err
	}
	err = svc.AddEndpoint("health", micro.HandlerFunc(func(req micro.Request) {
		body, err := json.Marshal(c.Status())
		if err != nil {
			_ = req.Error("500", err.Error(), nil)
			return
		}
		_ = req.Respond(body)
	}), micro.WithEndpointSubject(HealthSubject(c.Service)))
	if err != nil {
		_ = svc.Stop()
		return nil, err
	}
	return svc, nil
}
