package recorder_test

import (
	"time"

	"dispatchmesh/events"
)

var now = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func failed(class events.ErrorClass, why string) events.Result {
	return events.Result{Outcome: events.OutcomeFailure, Approach: "a", Error: why, ErrorClass: class, TokensIn: 10, TokensOut: 5, Cost: 0.01}
}

func ok() events.Result {
	return events.Result{Outcome: events.OutcomeSuccess, Approach: "b", Summary: "fixed", TokensIn: 10, TokensOut: 5}
}
