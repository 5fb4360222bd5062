package task

import "github.com/dispatchmesh/dispatchmesh/events"

// CountsForHistory reports whether an attempt's outcome enters its (type,
// subject) history: what the model did on the subject — a success, a
// failure it reported, an answer that was rejected. A provider that stayed
// unavailable, a request refused before it was sent and every fault of the
// deployment (events.DeploymentFault) say nothing about the subject: in
// the history they would start its next task on PIVOT (the recurring-failure
// rule counts them) and crowd its real failures out of the prompt.
func CountsForHistory(res events.Result) bool { return modelsOwn(res) }
