package scoring

import (
	"slices"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// RungThin reports whether the type's window holds too few of its
// retries on rung to climb onto it more than p.RungCanary at a time
// (AdmitRung): fewer than p.RungCanary, or — while none of them has
// succeeded and a rung floor applies — fewer than p.RungMinSamples. A rung whose first retries
// fail is climbed one canary at a time until one succeeds or it has the
// samples to be judged on its own: meanwhile the evidence that stops the
// rest (the rung floor, with the other types' retries on the rung)
// arrives before they are paid for, not after.
func (p Policy) RungThin(s Stats, rung events.Rung) bool {
	p = p.WithDefaults()
	if p.RungCanary < 0 || rung == "" {
		return false
	}
	tries, successes := p.RungRate(s, rung)
	return tries < p.RungCanary || p.RungFloor >= 0 && successes == 0 && tries < p.RungMinSamples
}

// AdmitRung decides whether the retry of task key on its pass may climb
// onto rung now: it may when the rung is not thin (RungThin), when that
// pass holds a place on it already (a redelivery), or when fewer than
// p.RungCanary places on it are held by retries still in flight; places
// older than p.CanaryTTL, and those whose retry has an outcome in the
// window, are given up first. s is not modified.
func (p Policy) AdmitRung(s Stats, key string, pass int, rung events.Rung, now time.Time) (next Stats, admit, changed bool) {
	p = p.WithDefaults()
	if !p.RungThin(s, rung) {
		return s, true, false
	}
	if slices.ContainsFunc(s.Rungs, func(c Canary) bool { return c.Key == key && c.Rung == rung && c.Pass == pass }) {
		return s, true, false
	}
	next = s // places free again (expired, or their outcome in) are given up
	next.Rungs = slices.DeleteFunc(slices.Clone(s.Rungs), func(c Canary) bool { return p.rungPlaceOver(s, c, now) })
	if p.RungPlaces(s, rung, now, "") >= p.RungCanary {
		return next, false, len(next.Rungs) != len(s.Rungs)
	}
	next.Rungs = append(next.Rungs, Canary{Key: key, At: now, Rung: rung, Pass: pass})
	return next, true, true
}

// RungPlaces counts the places on rung held by a retry other than self's
// that is still in flight: its place unexpired, its outcome on the rung
// not in the window.
func (p Policy) RungPlaces(s Stats, rung events.Rung, now time.Time, self string) int {
	p = p.WithDefaults()
	n := 0
	for _, c := range s.Rungs {
		if c.Rung == rung && c.Key != self && !p.rungPlaceOver(s, c, now) {
			n++
		}
	}
	return n
}

// rungPlaceOver reports whether place c is free again: expired, or its
// retry's outcome on the rung is in the window.
func (p Policy) rungPlaceOver(s Stats, c Canary, now time.Time) bool {
	if now.Sub(c.At) >= p.CanaryTTL {
		return true
	}
	key := events.MsgID(c.Key, c.Pass, "outcome") // the recorder's key for the pass's outcome
	return slices.ContainsFunc(s.Outcomes, func(o Outcome) bool {
		return o.Retry && o.Rung == c.Rung && o.Task == c.Key && (c.Pass == 0 || o.Key == key)
	})
}
