package verifier

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
)

// HTTP POSTs the task JSON to a URL: 2xx means the problem exists, 404 or 410
// mean it is gone, any other status, a transport error or a timeout is an
// error. The first MaxDetail bytes of the response body are the detail.
type HTTP struct {
	// Client sends the request. Default http.DefaultClient.
	Client *http.Client
	URL    string
	// Timeout bounds the whole exchange. Default DefaultTimeout.
	Timeout time.Duration
}

// StatusError is an HTTP verifier's answer that is neither 2xx nor 404/410.
type StatusError struct {
	StatusCode int
	Status     string
	Body       string
}

func (e *StatusError) Error() string {
	if e.Body == "" {
		return "verifier answered " + e.Status
	}
	return fmt.Sprintf("verifier answered %s: %s", e.Status, e.Body)
}

// Check POSTs the task and reads the verdict from the status code.
func (c *HTTP) Check(ctx context.Context, t events.Task) (events.Verification, error) {
	v := events.Verification{Verifier: policy.VerifierHTTP}
	data, err := json.Marshal(t)
	if err != nil {
		return v, fmt.Errorf("encode task: %w", err)
	}
	d := timeout(c.Timeout)
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, c.URL, bytes.NewReader(data))
	if err != nil {
		return v, fmt.Errorf("http verifier: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(events.HeaderTaskID, t.ID)
	base := c.Client
	if base == nil {
		base = http.DefaultClient
	}
	// A redirect to another host is not followed: the task's body would go
	// where the policy never said (the host a 307 or 308 names).
	client := *base
	client.CheckRedirect = func(next *http.Request, via []*http.Request) error {
		if next.URL.Host != req.URL.Host {
			return fmt.Errorf("redirected to another host, %s: not followed", next.URL.Host)
		}
		if base.CheckRedirect != nil {
			return base.CheckRedirect(next, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	resp, err := client.Do(req)
	if err != nil {
		return v, fmt.Errorf("http verifier: %w", checkErr(ctx, cctx, d, err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxDetail+1))
	if err != nil {
		return v, fmt.Errorf("http verifier %s: read body: %w", c.URL, checkErr(ctx, cctx, d, err))
	}
	detail := clip(string(body))
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		v.Verdict, v.Detail = events.VerdictExists, detail
	case code == http.StatusNotFound || code == http.StatusGone:
		v.Verdict, v.Detail = events.VerdictStale, detail
	default:
		return v, fmt.Errorf("http verifier %s: %w", c.URL, &StatusError{StatusCode: code, Status: resp.Status, Body: detail})
	}
	return v, nil
}
