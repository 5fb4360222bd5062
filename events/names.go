package events

import "strconv"

// Names the stream and the derived stores go by: the services provision
// them, `dispatch rebuild` reads and compares them.
const (
	// Stream holds every task event and every review record (Limits retention).
	// Only the services publish to it.
	Stream = "DISPATCH"
	// SubmitStream holds what clients publish: every submission
	// (dispatch.submit.>), with a short Msg-Id duplicate window of its own,
	// so no id a client chooses can collide with a service's on Stream.
	SubmitStream = "DISPATCH_SUBMIT"

	BucketTasks   = "dispatch_tasks"   // task state by task id
	BucketTrust   = "dispatch_trust"   // the gate's facts by task type (the outcomes are a stream)
	BucketHistory = "dispatch_history" // last outcomes and failures by (type, subject)
	BucketHeld    = "dispatch_held"    // the passes the gate holds back (trust, canaries), by type, oldest first
)

// KVStream is the stream that holds a KV bucket (nats.go names it so): what
// a consumer of the bucket's changes, or a read of its last sequence, names.
func KVStream(bucket string) string { return "KV_" + bucket }

// MsgID is the deterministic id (Nats-Msg-Id) of a task's event for one
// pass: "<task id>:<pass>:<stage>". A redelivered input republishes the same
// id; outcome history and trust stats key an attempt by it too.
func MsgID(taskID string, pass int, stage string) string {
	return taskID + ":" + strconv.Itoa(pass) + ":" + stage
}
