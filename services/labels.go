package services

import "sync"

// LabelOther is the label value a LabelSet gives every value it has no
// room for.
const LabelOther = "other"

// DefaultMaxTypeLabels is how many task types the policy does not name get
// a metric label of their own, per process, when nothing else is set
// (DISPATCH_METRICS_TYPE_LABELS).
const DefaultMaxTypeLabels = 100

// LabelSet bounds the values of a metric label that come from outside the
// process, such as a task's type, which whoever submits the task chooses.
// Every label value is a series kept in memory (and scraped) until the
// process ends: 10,000 made-up types would be 10,000 series of every metric
// labelled by type.
//
// A value the set names (a type the policy names) always has a label of its
// own. Of the others, the first max seen get theirs and keep it; every later
// one is LabelOther. A label's series count is thus at most the named values
// plus max plus one. A LabelSet is safe for concurrent use; a nil *LabelSet
// labels every value LabelOther.
type LabelSet struct {
	max   int
	named func(string) bool

	mu  sync.RWMutex
	own map[string]struct{}
}

// NewLabelSet returns a set that gives max values of their own besides the
// named ones (named nil: none is named; max < 0 is 0). named is asked at
// every call, so it may follow a policy that changes.
func NewLabelSet(max int, named func(string) bool) *LabelSet {
	return &LabelSet{max: max, named: named, own: map[string]struct{}{}}
}

// Label is the label value of v: v itself, or LabelOther.
func (s *LabelSet) Label(v string) string {
	if s.Own(v) {
		return v
	}
	return LabelOther
}

// Own reports whether v has a label of its own, giving it one when there is
// room.
func (s *LabelSet) Own(v string) bool {
	if s == nil {
		return false
	}
	if s.named != nil && s.named(v) {
		return true
	}
	s.mu.RLock()
	_, ok := s.own[v]
	full := len(s.own) >= s.max
	s.mu.RUnlock()
	if ok || full {
		return ok
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.own[v]; ok {
		return true
	}
	if len(s.own) >= s.max {
		return false
	}
	s.own[v] = struct{}{}
	return true
}
