// Package services is the runtime every dispatchmesh service shares.
//
// A service is a Handler: it gets one message and returns the messages it
// wants published, or an error. The router (Run) consumes from the service's
// durable pull consumer, calls the handler, publishes the outputs with their
// deterministic Nats-Msg-Ids, and only then acks. Errors steer what happens to
// the message:
//
//	nil              publish outputs, ack
//	Snooze(d)        nak with delay d; the attempt is not counted
//	Dead(reason,err) copy the original bytes to dispatch.review.<reason>, terminate
//	any other error  nak with the retry policy's delay until MaxDeliver, then
//	                 copy to dispatch.review.poison and terminate
//
// Handlers never touch a JetStream message, so they are plain functions that
// unit tests can call directly. What is not the service's own concern is
// Middleware around the handler, one per file: Recoverer, Heartbeat,
// Timeout, Latency, Outcomes, Logging and DeadLetters (which decides the
// fates above). Router.chain composes them.
package services
