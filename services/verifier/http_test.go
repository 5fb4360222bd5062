package verifier

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// httpVerifier answers by path, after checking the request carries the task.
func httpVerifier(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var task events.Task
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" ||
			json.NewDecoder(r.Body).Decode(&task) != nil || task.ID != "t1" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		switch r.URL.Path {
		case "/ok":
			io.WriteString(w, "still broken\n")
		case "/big":
			io.WriteString(w, strings.Repeat("x", 5*MaxDetail))
		case "/gone":
			http.Error(w, "no such issue", http.StatusNotFound)
		case "/gone410":
			w.WriteHeader(http.StatusGone)
		case "/err":
			http.Error(w, "database down", http.StatusInternalServerError)
		case "/slow":
			<-r.Context().Done() // until the client gives up
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestHTTP(t *testing.T) {
	srv := httpVerifier(t)
	tests := []struct {
		path    string
		verdict string
		detail  string
	}{
		{"/ok", events.VerdictExists, "still broken"},
		{"/gone", events.VerdictStale, "no such issue"},
		{"/gone410", events.VerdictStale, ""},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			v, err := (&HTTP{Client: srv.Client(), URL: srv.URL + tt.path}).Check(context.Background(), testTask("t1"))
			if err != nil {
				t.Fatal(err)
			}
			if v.Verdict != tt.verdict || v.Detail != tt.detail || v.Verifier != "http" {
				t.Errorf("got %+v, want %s %q", v, tt.verdict, tt.detail)
			}
		})
	}
}

func TestHTTPDetailIsClipped(t *testing.T) {
	srv := httpVerifier(t)
	v, err := (&HTTP{URL: srv.URL + "/big"}).Check(context.Background(), testTask("t1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Detail) > MaxDetail || !strings.HasSuffix(v.Detail, "…") {
		t.Errorf("detail is %d bytes, want at most %d ending in …", len(v.Detail), MaxDetail)
	}
}

func TestHTTPServerError(t *testing.T) {
	srv := httpVerifier(t)
	_, err := (&HTTP{URL: srv.URL + "/err"}).Check(context.Background(), testTask("t1"))
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != 500 || se.Body != "database down" {
		t.Fatalf("err = %v, want StatusError 500", err)
	}
}

func TestHTTPTimeout(t *testing.T) {
	srv := httpVerifier(t)
	_, err := (&HTTP{URL: srv.URL + "/slow", Timeout: 100 * time.Millisecond}).Check(context.Background(), testTask("t1"))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
}

func TestHTTPUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	_, err := (&HTTP{URL: url}).Check(context.Background(), testTask("t1"))
	if err == nil || errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want a connection error", err)
	}
}

// A verifier that redirects to another host does not get the task's body
// sent there: the redirect is an error. One to its own host is followed.
func TestHTTPRedirectToAnotherHostIsRefused(t *testing.T) {
	var stolen bool
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { stolen = true }))
	t.Cleanup(other.Close)
	srv := httpVerifier(t)
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/x", http.StatusTemporaryRedirect) // 307: the body is sent again
	}))
	t.Cleanup(redirector.Close)
	if _, err := (&HTTP{URL: redirector.URL + "/away"}).Check(context.Background(), testTask("t1")); err == nil || !strings.Contains(err.Error(), "another host") || stolen {
		t.Fatalf("redirect to another host: %v (body sent there: %v), want an error and nothing sent", err, stolen)
	}
	same := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/here" {
			http.Redirect(w, r, "/ok", http.StatusTemporaryRedirect)
			return
		}
		srv.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(same.Close)
	if v, err := (&HTTP{URL: same.URL + "/here"}).Check(context.Background(), testTask("t1")); err != nil || v.Verdict != events.VerdictExists {
		t.Fatalf("redirect on its own host: %+v, %v", v, err)
	}
}
