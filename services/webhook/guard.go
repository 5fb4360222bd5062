package webhook

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// ErrNotAllowed marks a callback URL the service may not call: its host is
// not on the allow-list, or it resolves to a loopback, link-local, private
// or otherwise internal address while private addresses are not allowed.
var ErrNotAllowed = errors.New("callback not allowed")

// Hosts is an allow-list of callback hosts: an entry is an exact host name
// ("hooks.example.com", compared without case), a suffix wildcard
// ("*.example.com": any name under example.com, not example.com itself), an
// IP address, or "*" (any host; the address checks still apply).
type Hosts []string

// Allows reports whether host (a URL's Hostname) is on the list.
func (h Hosts) Allows(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	for _, e := range h {
		e = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(e)), ".")
		switch {
		case e == "*":
			return true
		case strings.HasPrefix(e, "*."):
			if strings.HasSuffix(host, e[1:]) && len(host) > len(e)-1 {
				return true
			}
		case e != "" && e == host:
			return true
		}
	}
	return false
}

// checkURL says why u may not be called under hosts (nil: it may). The
// addresses it resolves to are checked when it is dialed (dialControl).
func checkURL(hosts Hosts, u string) error {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Hostname() == "" {
		return fmt.Errorf("%w: %q is not an http or https URL", ErrNotAllowed, u)
	}
	if !hosts.Allows(p.Hostname()) {
		return fmt.Errorf("%w: host %q is not on the allow-list (DISPATCH_WEBHOOK_ALLOW_HOSTS)", ErrNotAllowed, p.Hostname())
	}
	return nil
}

// internal reports whether a is an address a callback must not reach
// unless private addresses are allowed: loopback, link-local, private
// (RFC 1918, RFC 4193), unspecified, multicast, CGNAT (100.64/10) and the
// IPv4-mapped forms of all of them.
func internal(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsPrivate() ||
		a.IsUnspecified() || a.IsMulticast() || a.IsInterfaceLocalMulticast() || cgnat.Contains(a) || !a.IsValid()
}

var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// dialControl refuses a connection to an internal address, checked on the
// address actually dialed (after DNS): a name that resolves to an internal
// address — at once, or only on a later lookup (DNS rebinding) — is
// refused, not only a URL that names one.
func dialControl(allowPrivate bool) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, _ syscall.RawConn) error {
		if allowPrivate {
			return nil
		}
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: cannot read the dialed address %q", ErrNotAllowed, address)
		}
		if internal(ap.Addr()) {
			return fmt.Errorf("%w: %s is an internal address (set DISPATCH_WEBHOOK_ALLOW_PRIVATE to allow)", ErrNotAllowed, ap.Addr())
		}
		return nil
	}
}

// newClient is the HTTP client of the deliveries: each request bounded by
// timeout, every dial checked by dialControl, no proxy from the
// environment (it would dial the proxy, not the receiver), and no redirect
// followed (a 3xx is an answer that is not 2xx: a failed try).
func newClient(timeout time.Duration, allowPrivate bool) *http.Client {
	d := &net.Dialer{Timeout: timeout, Control: dialControl(allowPrivate)}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:         d.DialContext,
			TLSHandshakeTimeout: timeout,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     90 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
