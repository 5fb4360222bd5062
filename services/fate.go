package services

import (
	"errors"
	"fmt"
	"time"
)

// Action is how the router settles a message.
type Action string

const (
	// ActionAck acknowledges the message: it is done.
	ActionAck Action = "ack"
	// ActionNak hands the message back to be delivered again after Delay.
	ActionNak Action = "nak"
	// ActionTerm terminates the message: it is never delivered again.
	ActionTerm Action = "term"
)

// Valid reports whether a is one of the actions.
func (a Action) Valid() bool { return a == ActionAck || a == ActionNak || a == ActionTerm }

// Result is what became of a message, as dispatch_messages_total and
// RunStats count it.
type Result string

const (
	ResultOK       Result = "ok"       // outputs published, acked
	ResultSnoozed  Result = "snoozed"  // Snooze: nak'ed with its delay, not a failure
	ResultRetried  Result = "retried"  // failed: nak'ed with the backoff delay
	ResultDead     Result = "dead"     // copied to dispatch.review.<reason>, terminated
	ResultShutdown Result = "shutdown" // handed back at shutdown
	// ResultNone counts nothing: the message was handed back because its
	// dead-letter record could not be published; it comes back.
	ResultNone Result = ""
)

// Valid reports whether r is one of the results.
func (r Result) Valid() bool {
	switch r {
	case ResultOK, ResultSnoozed, ResultRetried, ResultDead, ResultShutdown, ResultNone:
		return true
	}
	return false
}

// Fate is what the router does with a message whose handler failed. The
// DeadLetters middleware decides it and returns it as the error; Logging
// and Outcomes read it; the router only carries out Action.
type Fate struct {
	Action Action
	// Delay is how long a nak'ed message waits before its next delivery.
	Delay time.Duration
	// Reason is a terminated message's review reason (its term reason).
	Reason string
	Result Result
	// Err is the failure: the handler's error, wrapped with the count of
	// deliveries when they are exhausted.
	Err error
}

func (f *Fate) Error() string { return fmt.Sprintf("%s: %v", f.Action, f.Err) }
func (f *Fate) Unwrap() error { return f.Err }

// FateOf reads the fate in a handler chain's error: nil is an ack; an
// error that carries no Fate (a chain without DeadLetters) is a failure
// handed back at once.
func FateOf(err error) *Fate {
	if err == nil {
		return &Fate{Action: ActionAck, Result: ResultOK}
	}
	var f *Fate
	if errors.As(err, &f) {
		return f
	}
	return &Fate{Action: ActionNak, Result: ResultRetried, Err: err}
}
