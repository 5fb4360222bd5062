package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dispatchmesh/dispatchmesh/internal/ops/review/reviewtest"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// The embedded server opens one listener, the clients' port; beyond
// loopback only with a login, which it then requires of every client.
func TestEmbeddedServerListeners(t *testing.T) {
	for _, c := range []struct {
		listen, user, password, creds string
		err                           string // a part of the error; "" for none
		refused                       bool   // errNATSLoginRequired
	}{
		{listen: "127.0.0.1:4222"},
		{listen: "localhost:4222"},
		{listen: "[::1]:4222"},
		{listen: "127.0.0.1:-1", user: "mesh", password: "pw"},
		{listen: "0.0.0.0:4222", user: "mesh", password: "pw"},
		{listen: "0.0.0.0:4222", err: "set DISPATCH_NATS_USER and DISPATCH_NATS_PASSWORD", refused: true},
		{listen: ":4222", err: "not a loopback address", refused: true},
		{listen: "[::]:4222", err: "not a loopback address", refused: true},
		{listen: "192.0.2.10:4222", err: "not a loopback address", refused: true},
		{listen: "nats.example.com:4222", err: "not a loopback address", refused: true},
		{listen: "0.0.0.0:4222", user: "mesh", err: "both DISPATCH_NATS_USER and DISPATCH_NATS_PASSWORD"},
		{listen: "127.0.0.1:4222", password: "pw", err: "both DISPATCH_NATS_USER and DISPATCH_NATS_PASSWORD"},
		{listen: "0.0.0.0:4222", user: "mesh", password: "pw", creds: "x.creds", err: "unset DISPATCH_NATS_CREDS"},
		{listen: "nonsense", err: "DISPATCH_NATS_LISTEN"},
		{listen: "127.0.0.1:x", err: "bad port"},
	} {
		cfg := Config{NATSListen: c.listen, NATSUser: c.user, NATSPassword: c.password, NATSCreds: c.creds}
		opts, err := embeddedOptions(cfg, t.TempDir())
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: %v, want an error saying %q", c, err, c.err)
			}
			if errors.Is(err, errNATSLoginRequired) != c.refused {
				t.Errorf("%+v: errors.Is(%v, errNATSLoginRequired) = %v", c, err, !c.refused)
			}
			continue
		}
		if err != nil {
			t.Errorf("%+v: %v", c, err)
			continue
		}
		if opts.Username != c.user || opts.Password != c.password {
			t.Errorf("%+v: login %q/%q", c, opts.Username, opts.Password)
		}
		others := map[string]int{
			"monitoring": opts.HTTPPort, "monitoring (TLS)": opts.HTTPSPort, "websocket": opts.Websocket.Port, "MQTT": opts.MQTT.Port,
			"cluster": opts.Cluster.Port, "gateway": opts.Gateway.Port, "leaf node": opts.LeafNode.Port, "profiling": opts.ProfPort,
		}
		for name, port := range others {
			if port != 0 {
				t.Errorf("%+v: the embedded server opens a %s port (%d)", c, name, port)
			}
		}
	}
}

// `dispatch up` refuses to start a NATS server other machines can reach
// without a login, naming the settings to change.
func TestUpRefusesNATSBeyondLoopbackWithoutLogin(t *testing.T) {
	t.Setenv("DISPATCH_NATS_LISTEN", "0.0.0.0:-1")
	t.Setenv("DISPATCH_HTTP_LISTEN", "off")
	t.Setenv("DISPATCH_DATA_DIR", t.TempDir())
	err := run(context.Background(), []string{"up"})
	if !errors.Is(err, errNATSLoginRequired) || !strings.Contains(err.Error(), "DISPATCH_NATS_USER") || !strings.Contains(err.Error(), "DISPATCH_NATS_LISTEN") {
		t.Fatalf("dispatch up with NATS on 0.0.0.0 and no login: %v", err)
	}
}

// With a login, `dispatch up` listens beyond loopback: its own services
// connect with it (it comes up), a client without it is refused, and the
// password is printed nowhere.
func TestUpWithLoginBeyondLoopback(t *testing.T) {
	const password = "pw-never-printed"
	_, natsURL, kill, out := startUpOut(t, t.TempDir(),
		"DISPATCH_NATS_LISTEN=0.0.0.0:-1", "DISPATCH_NATS_USER=mesh", "DISPATCH_NATS_PASSWORD="+password)
	if _, err := nats.Connect(natsURL); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("a client without the login: %v, want %v", err, nats.ErrAuthorization)
	}
	if _, err := nats.Connect(natsURL, nats.UserInfo("mesh", "wrong")); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("a client with a wrong password: %v, want %v", err, nats.ErrAuthorization)
	}
	nc, err := nats.Connect(natsURL, nats.UserInfo("mesh", password))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Request("$SRV.PING."+services.MicroService, nil, reviewtest.Patience); err != nil {
		t.Fatalf("the API does not answer a client with the login: %v", err)
	}
	if !strings.Contains(out.String(), "export NATS_URL="+natsURL+" NATS_USER=mesh NATS_PASSWORD=…") {
		t.Errorf("the banner does not say a login is needed:\n%s", out.String())
	}
	// What the banner says to export is what dispatch, as a client, reads.
	cmd := exec.Command(os.Args[0], "tasks")
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "NATS_URL="+natsURL, "NATS_USER=mesh", "NATS_PASSWORD="+password)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("dispatch tasks with NATS_USER and NATS_PASSWORD: %v\n%s", err, b)
	}
	kill()
	if strings.Contains(out.String(), password) {
		t.Errorf("dispatch up printed the NATS password:\n%s", out.String())
	}
}

// reviewLine finds the review page's address in up's banner.
var reviewLine = regexp.MustCompile(`(?m)^  review:\s+(http://\S+)`)

// Without DISPATCH_HTTP_TOKEN `dispatch up` makes a token and prints the
// page's address with it: that address opens the page (the token traded
// for a cookie, gone from the address); without the token nothing does,
// whatever the Host header says; and the token is in the banner's review
// line and nowhere else of what up writes, from start to a clean stop,
// logging at debug.
func TestUpBannerTokenOpensThePage(t *testing.T) {
	port := freePorts(t, 1)[0]
	pid, _, kill, out := startUpOut(t, t.TempDir(), fmt.Sprintf("DISPATCH_HTTP_LISTEN=127.0.0.1:%d", port), "DISPATCH_LOG_LEVEL=debug")
	m := reviewLine.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no review address in the banner:\n%s", out.String())
	}
	page, err := url.Parse(m[1])
	if err != nil {
		t.Fatal(err)
	}
	token := page.Query().Get("token")
	if token == "" || page.Host != fmt.Sprintf("127.0.0.1:%d", port) {
		t.Fatalf("the banner's address %q has no token or is not the listener", m[1])
	}
	base := "http://" + page.Host

	for _, host := range []string{"", "localhost", "localhost:8080", "127.0.0.1"} {
		req, err := http.NewRequest("GET", base+"/api/review", nil)
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("no token, Host %q: %d, want 401", host, resp.StatusCode)
		}
	}

	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	browser := &http.Client{Jar: jar}
	get := func(u string) (int, string, *url.URL) {
		t.Helper()
		resp, err := browser.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), resp.Request.URL
	}
	if code, body, at := get(m[1]); code != http.StatusOK || !strings.Contains(body, "Review queue") || at.RawQuery != "" {
		t.Fatalf("the banner's address: %d at %s\n%.300s", code, at, body)
	}
	if code, body, _ := get(base + "/tasks"); code != http.StatusOK || !strings.Contains(body, "Tasks") {
		t.Errorf("the explorer with the cookie: %d", code)
	}
	if code, _, _ := get(base + "/?token=wrong"); code != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d", code)
	}

	// A clean stop logs too.
	if p, err := os.FindProcess(pid); err == nil && p.Signal(syscall.SIGTERM) == nil {
		deadline := time.Now().Add(reviewtest.Patience) // a deadlock guard
		for !strings.Contains(out.String(), "stopped cleanly") && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	kill()
	all := out.String()
	if n := strings.Count(all, token); n != 1 {
		t.Fatalf("the token appears %d times in what up wrote, want once:\n%s", n, all)
	}
	for _, line := range strings.Split(all, "\n") {
		if strings.Contains(line, token) && !strings.HasPrefix(line, "  review:") {
			t.Errorf("the token is on a line other than the banner's review line: %q", line)
		}
	}
}

// `dispatch web` without DISPATCH_HTTP_TOKEN prints the page's address
// with a token of its own, which opens the page; nothing opens it without.
func TestWebCommandMakesItsToken(t *testing.T) {
	m := reviewtest.Start(t, reviewtest.FailUnless("x"), reviewtest.Options{})
	newCLI(t, m)
	t.Setenv("DISPATCH_HTTP_TOKEN", "")
	addr, _, _ := runWeb(t, regexp.MustCompile(`review page: (http://\S+)`), "-listen", "127.0.0.1:0")
	page, err := url.Parse(addr)
	if err != nil || page.Query().Get("token") == "" {
		t.Fatalf("dispatch web printed %q: no token (%v)", addr, err)
	}
	resp, err := http.Get("http://" + page.Host + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without the token: %d", resp.StatusCode)
	}
	jar, _ := cookiejar.New(nil)
	resp, err = (&http.Client{Jar: jar}).Get(addr)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Request.URL.RawQuery != "" {
		t.Errorf("the printed address: %d at %s", resp.StatusCode, resp.Request.URL)
	}
}
