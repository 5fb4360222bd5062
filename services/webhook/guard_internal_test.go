package webhook

import (
	"errors"
	"net/netip"
	"testing"
	"time"
)

func TestHostsAllows(t *testing.T) {
	h := Hosts{"hooks.example.com", "*.corp.example", "203.0.113.9"}
	for host, want := range map[string]bool{
		"hooks.example.com": true, "HOOKS.example.com.": true, "a.hooks.example.com": false,
		"x.corp.example": true, "a.b.corp.example": true, "corp.example": false, "evilcorp.example": false,
		"203.0.113.9": true, "203.0.113.10": false, "": false,
	} {
		if got := h.Allows(host); got != want {
			t.Errorf("%q: %v, want %v", host, got, want)
		}
	}
	if !(Hosts{"*"}).Allows("anything.example") || (Hosts{}).Allows("a.example") {
		t.Error("* must allow any host, an empty list none")
	}
}

func TestDialControl(t *testing.T) {
	for addr, refused := range map[string]bool{
		"127.0.0.1:80": true, "[::1]:443": true, "10.1.2.3:80": true, "172.16.0.1:80": true, "192.168.1.1:80": true,
		"169.254.169.254:80": true, "[fe80::1]:80": true, "[fd00::1]:80": true, "0.0.0.0:80": true, "100.64.0.1:80": true,
		"[::ffff:127.0.0.1]:80": true, "224.0.0.1:80": true,
		"203.0.113.9:443": false, "[2001:db8::1]:443": false, "8.8.8.8:443": false,
	} {
		err := dialControl(false)("tcp", addr, nil)
		if got := errors.Is(err, ErrNotAllowed); got != refused {
			t.Errorf("%s: %v, want refused %v", addr, err, refused)
		}
		if err := dialControl(true)("tcp", addr, nil); err != nil {
			t.Errorf("%s with private allowed: %v", addr, err)
		}
	}
	if !internal(netip.Addr{}) {
		t.Error("an invalid address must count as internal")
	}
}

func TestCheckURL(t *testing.T) {
	h := Hosts{"hooks.example.com"}
	for u, ok := range map[string]bool{
		"https://hooks.example.com/x": true, "http://hooks.example.com:8080/": true,
		"https://other.example/x": false, "ftp://hooks.example.com/": false, "::": false,
	} {
		if err := checkURL(h, u); (err == nil) != ok || (err != nil && !errors.Is(err, ErrNotAllowed)) {
			t.Errorf("%q: %v, want allowed %v", u, err, ok)
		}
	}
}

func TestBackoff(t *testing.T) {
	lo := Backoff(time.Second, 30*time.Second, func() float64 { return 0 })
	hi := Backoff(time.Second, 30*time.Second, func() float64 { return 0.999999 })
	for n, d := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 5: 16 * time.Second, 6: 30 * time.Second, 40: 30 * time.Second} {
		if got := lo(n); got != d/2 {
			t.Errorf("try %d, least jitter: %s, want %s", n, got, d/2)
		}
		if got := hi(n); got > d || got < d-time.Millisecond {
			t.Errorf("try %d, most jitter: %s, want about %s", n, got, d)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"": 0, "30": 30 * time.Second, "0": 0, "-5": 0, "soon": 0, "99999999999": 0,
		"Fri, 27 Nov 2026 12:01:00 GMT": time.Minute, "Fri, 27 Nov 2026 11:00:00 GMT": 0,
	} {
		if got := RetryAfter(v, now); got != want {
			t.Errorf("%q: %s, want %s", v, got, want)
		}
	}
}

func FuzzCheckURL(f *testing.F) {
	f.Add("https://hooks.example.com/x")
	f.Add("http://[::1]:80/")
	f.Fuzz(func(t *testing.T, u string) {
		if err := checkURL(Hosts{"hooks.example.com"}, u); err != nil && !errors.Is(err, ErrNotAllowed) {
			t.Fatalf("%q: %v is not ErrNotAllowed", u, err)
		}
	})
}
