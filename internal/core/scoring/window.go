package scoring

import "slices"

const (
	// Keep is how many outcomes of a type the outcome stream keeps: twice
	// the largest window (MaxWindow), so an outcome published again after
	// it left the deduplication window (it sorts before the window by its
	// time) can never push one of the window's out of the stream.
	Keep = 2 * MaxWindow
	// MaxWindow is the largest trust window a policy may ask for.
	MaxWindow = 100
)

// Insert returns window with o in its place by (At, Key), at most limit
// outcomes kept (the oldest dropped); changed is false when an outcome with
// o's key is already there. The window's order does not depend on the order
// outcomes arrive in, so a replay of the stream (dispatch rebuild) yields
// the same window. window is not modified.
func Insert(window []Outcome, o Outcome, limit int) (next []Outcome, changed bool) {
	if slices.ContainsFunc(window, func(x Outcome) bool { return x.Key == o.Key }) {
		return window, false
	}
	i := len(window)
	for i > 0 && outcomeAfter(window[i-1], o) {
		i--
	}
	if limit > 0 && len(window) >= limit && i == 0 {
		return window, false // older than everything a full window keeps
	}
	return lastN(slices.Insert(slices.Clone(window), i, o), limit), true
}

// OutcomeAfter reports whether a sorts after b in a window: by At, then Key.
func OutcomeAfter(a, b Outcome) bool { return outcomeAfter(a, b) }
