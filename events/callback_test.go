package events

import (
	"strings"
	"testing"
)

func TestCheckCallbackURL(t *testing.T) {
	for _, c := range []struct {
		url, problem string
	}{
		{"https://hooks.example.com/done?x=1", ""},
		{"http://10.0.0.1:8080/", ""}, // the service's dial guard decides about private hosts
		{"ftp://hooks.example.com/", `must be an http or https URL, not "ftp"`},
		{"/relative", `must be an http or https URL, not ""`},
		{"https:///nohost", "must name a host"},
		{"https://user:pw@hooks.example.com/", "must not carry user info"},
		{"https://hooks.example.com/#frag", "must not carry a fragment"},
		{"https://hooks.example.com/\x7f", "is not a URL"},
		{"https://h.example/" + strings.Repeat("a", MaxCallbackURLLen), "is 2066 bytes, limit is 2048"},
	} {
		err := CheckCallbackURL(c.url)
		switch {
		case c.problem == "" && err != nil:
			t.Errorf("%q: %v, want accepted", c.url, err)
		case c.problem != "" && (err == nil || err.Error() != c.problem):
			t.Errorf("%q: %v, want %q", c.url, err, c.problem)
		}
	}
	if _, err := DecodeSubmit([]byte(`{"type":"a","subject":"s","callback_url":"gopher://x"}`), ""); err == nil ||
		!strings.Contains(err.Error(), `"callback_url" must be an http or https URL, not "gopher"`) {
		t.Errorf("decode: %v, want the callback_url problem", err)
	}
}
