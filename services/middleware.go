package services

// Middleware wraps a Handler with a concern that is not the service's own:
// recovering panics, heartbeats, deadlines, metrics, logging, dead-letters.
// Each lives in its own file. The router composes them around every
// service's handler in the order Router.chain documents; Spec.Middleware
// adds more, closest to the handler.
type Middleware func(Handler) Handler

// Chain wraps h in mws: the first is the outermost, the last calls h.
func Chain(h Handler, mws ...Middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}
