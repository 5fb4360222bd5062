package events

import (
	"errors"
	"fmt"
	"net/url"
)

// CheckCallbackURL says what makes u unusable as a callback URL: it must be
// an absolute http or https URL with a host, without user info or a
// fragment, of at most MaxCallbackURLLen bytes. Whether its host may be
// called is the webhook service's decision (its allow-list), not this one.
func CheckCallbackURL(u string) error {
	if len(u) > MaxCallbackURLLen {
		return fmt.Errorf("is %d bytes, limit is %d", len(u), MaxCallbackURLLen)
	}
	p, err := url.Parse(u)
	switch {
	case err != nil:
		return errors.New("is not a URL")
	case p.Scheme != "http" && p.Scheme != "https":
		return fmt.Errorf("must be an http or https URL, not %q", p.Scheme)
	case p.Host == "" || p.Hostname() == "":
		return errors.New("must name a host")
	case p.User != nil:
		return errors.New("must not carry user info")
	case p.Fragment != "" || p.RawFragment != "":
		return errors.New("must not carry a fragment")
	}
	return nil
}
