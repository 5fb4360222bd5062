package task

import (
	"slices"
	"strconv"
	"strings"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Begin: the executor starts the attempt of pass b.Run.Pass (SPEC §6): the
// task is running. A task that moved on or ended is skipped (CauseMovedOn,
// CauseEnded); a redelivery of a running pass changes nothing. A tool loop
// kept from an earlier pass is dropped: it is never resumed.
func Begin(st events.TaskState, found bool, b events.Base) (events.TaskState, Cause) {
	if found {
		if c, ok := guard(st, b.Run.Pass); !ok {
			return st, c
		}
	} else {
		st = New(b.Task)
	}
	stale := st.Resume != nil && st.Resume.Pass != b.Run.Pass
	if st.Status == events.StatusRunning && st.Pass == b.Run.Pass && !stale {
		return st, CauseRedelivered
	}
	if stale {
		st.Resume = nil
	}
	if st.Status == events.StatusHeld { // re-admitted: the hold is over
		st.Reason, st.Cause = "", ""
	}
	st.Status, st.Pass, st.UpdatedAt = events.StatusRunning, b.Run.Pass, b.At
	return st, CauseApplied
}

// CutShort keeps what a try cut short leaves for the attempt's next try:
// what its calls spent (unbilled until the attempt's Result) and its tool
// loop to resume (nil: none). transient counts the failure against the
// attempt's transient budget (TaskState.TransientRetries).
func CutShort(st events.TaskState, found bool, b events.Base, spent events.Usage, resume *events.Resume, transient bool) (events.TaskState, Cause) {
	if !found {
		st = New(b.Task)
	}
	if transient {
		st.TransientRetries++
	}
	st.Unbilled = st.Unbilled.Add(spent)
	st.Resume = resume
	return st, CauseApplied
}

// Abandon: a human's cancel cut the executor's attempt of pass b.Run.Pass
// short, and the attempt is dropped — no Result, no attempt recorded.
// spent is what the attempt's calls spent: its earlier tries' (the
// Unbilled it began with) and this try's answered calls'. It stays the
// attempt's unbilled spend, whatever of it the try had already kept
// (CutShort) or settled (Settle) when the cancel was heard, so no answered
// call's spend is lost with the attempt. A task the cancel ended keeps no
// tool loop to resume (as Act). A later pass's state is not touched.
func Abandon(st events.TaskState, found bool, b events.Base, spent events.Usage) (events.TaskState, Cause) {
	if !found {
		st = New(b.Task)
	}
	if st.Pass > b.Run.Pass {
		return st, CauseMovedOn
	}
	resume := st.Resume
	if events.Terminal(st.Status) {
		resume = nil
	}
	if st.Unbilled == spent && st.Resume == resume {
		return st, CauseRedelivered
	}
	st.Unbilled, st.Resume = spent, resume
	return st, CauseApplied
}

// Settle resets the attempt's transient count and tool loop once the
// attempt is over. Its unbilled spend stays: the attempt's Result bills it,
// and it is billed once that Result is recorded (Apply). Until then a
// redelivery whose Executed was never stored (its publish failed, the
// process died) bills it again, instead of losing it.
func Settle(st events.TaskState, found bool, b events.Base) (events.TaskState, Cause) {
	if !found {
		st = New(b.Task)
	}
	if st.TransientRetries == 0 && st.Resume == nil {
		return st, CauseRedelivered
	}
	st.TransientRetries, st.Resume = 0, nil
	return st, CauseApplied
}

// AddFailed bans a request hash that failed deterministically in pass
// b.Run.Pass: the executor never sends it again (idempotent).
func AddFailed(st events.TaskState, found bool, b events.Base, hash string, class events.ErrorClass) (events.TaskState, Cause) {
	if !found {
		st = New(b.Task)
	}
	entry := FailedEntry(hash, b.Run.Pass)
	if slices.ContainsFunc(st.FailedRequests, func(e string) bool { return e == entry || strings.HasPrefix(e, entry+"/") }) {
		return st, CauseRedelivered
	}
	if class != "" && class != events.ErrorClassDeterministic {
		entry += "/" + string(class)
	}
	st.FailedRequests = append(st.FailedRequests, entry)
	return st, CauseApplied
}

// AddRefused counts a request refused for repeating a failed one: once
// per pass (a refusal ends its pass), however often the pass is delivered.
func AddRefused(st events.TaskState, found bool, b events.Base) (events.TaskState, Cause) {
	if !found {
		st = New(b.Task)
	}
	if st.RefusedPass == b.Run.Pass {
		return st, CauseRedelivered
	}
	st.Refused++
	st.RefusedPass = b.Run.Pass
	return st, CauseApplied
}

// Executed folds the facts an attempt's outcome carries into the state, as
// the executor wrote them while the attempt ran: a refused request is
// counted, a request that failed in a way that bans it is banned.
//
// The requests the attempt's calls banned on models of the type's chain
// before another answered (Result.Banned) are banned too.
func Executed(st events.TaskState, found bool, b events.Base, res events.Result) (events.TaskState, Cause) {
	cause := CauseRedelivered
	for _, e := range res.Banned {
		hash, class, _ := strings.Cut(e, "/")
		if next, c := AddFailed(st, found, b, hash, events.ErrorClass(class)); c == CauseApplied {
			st, found, cause = next, true, CauseApplied
		}
	}
	var c Cause
	switch {
	case res.Refused:
		st, c = AddRefused(st, found, b)
	case res.RequestHash != "" && Bans(res.ErrorClass):
		st, c = AddFailed(st, found, b, res.RequestHash, res.ErrorClass)
	default:
		return st, cause
	}
	if c == CauseApplied {
		cause = CauseApplied
	}
	return st, cause
}

// FailedEntry is how a banned hash is kept in TaskState.FailedRequests:
// "<hash>@<pass>", the pass whose request failed, followed by "/<class>"
// when the failure was not plainly deterministic (auth, quota, config): a
// redelivery of that pass whose outcome was lost fails again with the class
// it failed with, without sending the request; every later pass refuses it.
func FailedEntry(hash string, pass int) string { return hash + "@" + strconv.Itoa(pass) }

// ParseFailedEntry reads a TaskState.FailedRequests entry: the hash, the
// pass it failed in (0 when the entry names none) and its class
// (deterministic when it names none).
func ParseFailedEntry(e string) (hash string, pass int, class events.ErrorClass) {
	hash, rest, _ := strings.Cut(e, "@")
	p, c, _ := strings.Cut(rest, "/")
	pass, _ = strconv.Atoi(p)
	class = events.ErrorClass(c)
	if class == "" {
		class = events.ErrorClassDeterministic
	}
	return hash, pass, class
}

// Bans reports whether a failure of this class bans the request's hash for
// the task: the identical request would fail the same way.
func Bans(class events.ErrorClass) bool {
	switch class {
	case events.ErrorClassDeterministic, events.ErrorClassAuth, events.ErrorClassQuota, events.ErrorClassConfig:
		return true
	}
	return false
}
