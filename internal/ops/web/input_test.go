package web

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
)

func TestSafeBack(t *testing.T) {
	for _, c := range []struct{ back, id, want string }{
		{"/", "t-1", "/"},
		{"/tasks/t-1", "t-1", "/tasks/t-1"},
		{"", "t-1", "/tasks/t-1"},
		{"", "", "/"},
		{"//evil.example/", "t-1", "/tasks/t-1"},
		{"https://evil.example/", "t-1", "/tasks/t-1"},
		{"/tasks/x?ok=forged", "t-1", "/tasks/t-1"},
		{`/tasks/\evil`, "", "/"},
		{"javascript:alert(1)", "", "/"},
	} {
		if got := safeBack(c.back, c.id); got != c.want {
			t.Errorf("safeBack(%q, %q) = %q, want %q", c.back, c.id, got, c.want)
		}
	}
}

func TestLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "localhost:8080": true, "127.0.0.1:8080": true, "[::1]:8080": true, "127.1.2.3": true,
		"dispatch.example.com": false, "10.0.0.1:8080": false, "localhost.evil.example:80": false, "": false,
	} {
		if got := loopbackHost(host); got != want {
			t.Errorf("loopbackHost(%q) = %v", host, got)
		}
	}
}

// FuzzReadAction: any body, JSON or form, decodes or fails with ErrInvalid.
func FuzzReadAction(f *testing.F) {
	f.Add("application/json", []byte(`{"note":"n","by":"b"}`))
	f.Add("application/json", []byte(`{"note":1}`))
	f.Add("application/json", []byte(`{"note":"a"} {"note":"b"}`))
	f.Add("application/x-www-form-urlencoded", []byte(`note=a%20b&by=c`))
	f.Add("application/x-www-form-urlencoded", []byte(`note=%zz`))
	f.Add("text/plain", []byte("\x00\xff"))
	f.Add("multipart/form-data; boundary=x", []byte("--x\r\n"))
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		r := httptest.NewRequest(http.MethodPost, "/api/tasks/t/requeue", strings.NewReader(string(body)))
		r.Header.Set("Content-Type", contentType)
		req, err := readAction(httptest.NewRecorder(), r)
		if err != nil && !errors.Is(err, review.ErrInvalid) {
			t.Fatalf("error %v is not ErrInvalid", err)
		}
		if err == nil && len(req.Note)+len(req.By) > maxBody {
			t.Fatalf("accepted %d bytes", len(req.Note)+len(req.By))
		}
	})
}

// FuzzFilter: any query decodes to a valid filter or fails with ErrInvalid.
func FuzzFilter(f *testing.F) {
	for _, q := range []string{"", "reason=gated&type=css_fix&age=24h&all=1", "age=-1h", "all=maybe", "reason=%00", "type=A%20B"} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, query string) {
		r := httptest.NewRequest(http.MethodGet, "/api/review", nil)
		r.URL.RawQuery = query
		got, err := filter(r)
		if err != nil {
			if !errors.Is(err, review.ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		if err := got.Validate(); err != nil {
			t.Fatalf("accepted an invalid filter %+v: %v", got, err)
		}
	})
}
