package events

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"
)

// Subject roots.
const (
	Root          = "dispatch"
	SubmitRoot    = Root + ".submit" // dispatch.submit.<type>
	TaskRoot      = Root + ".task"   // dispatch.task.<id>.<stage>
	ReviewRoot    = Root + ".review" // dispatch.review.<reason>.<id>
	IndexRoot     = Root + ".index"  // dispatch.index.<type>.<subject key>: one entry per task
	IndexFilter   = IndexRoot + ".>"
	SubmitAPI     = Root + ".api.submit"
	AllSubjects   = Root + ".>"
	SubmitFilter  = SubmitRoot + ".>" // every dispatch.submit.<type>
	ReviewFilter  = ReviewRoot + ".>"
	taskWildcard  = TaskRoot + ".*."
	reviewSubject = ReviewRoot + "."
)

// Stages are the last token of a task subject. Each stage is published by one
// service and consumed by the next.
const (
	StageQueued    = "queued"    // intake → verifier (first attempt)
	StageRetry     = "retry"     // recorder → verifier (next attempt)
	StageVerified  = "verified"  // verifier → gate
	StageAdmitted  = "admitted"  // gate → prompt builder
	StageHeld      = "held"      // gate → gate's held consumer (trust, canaries)
	StageWake      = "wake"      // gate's sweeper → gate's held consumer: a held pass looked at again
	StagePrompted  = "prompted"  // prompt builder → executor
	StageExecuted  = "executed"  // executor → recorder
	StageSucceeded = "succeeded" // recorder: terminal
	StageCancelled = "cancelled" // verifier: terminal (stale)
)

// Review reasons are the third token of a review subject.
const (
	ReviewRejected  = "rejected"  // bad input, original bytes kept
	ReviewGated     = "gated"     // trust gate: needs_human_review
	ReviewEscalated = "escalated" // retries exhausted: blocked
	ReviewPoison    = "poison"    // a message exhausted its deliveries
	ReviewStuck     = "stuck"     // skip budget exhausted
	// ReviewAction records a human's action on a task (not a reason to review).
	ReviewAction = "action"
)

// SubmitFilters match every submission: dispatch.submit.<type>, and bare
// dispatch.submit, which names no type: it is kept, and rejected.
var SubmitFilters = []string{SubmitRoot, SubmitFilter}

// SubmitSubject is where clients publish a task of the given type.
func SubmitSubject(taskType string) string { return SubmitRoot + "." + taskType }

// TaskSubject is the subject of one stage event of one task.
func TaskSubject(id, stage string) string { return TaskRoot + "." + id + "." + stage }

// StageFilter matches one stage of every task (a consumer's filter).
func StageFilter(stage string) string { return taskWildcard + stage }

// TaskFilter matches every stage event of one task.
func TaskFilter(id string) string { return TaskRoot + "." + id + ".>" }

// ReviewSubject is the review (dead-letter) subject for a reason and a key
// (the task id when there is one).
func ReviewSubject(reason, key string) string { return reviewSubject + reason + "." + key }

// ReviewTaskFilter matches every review record of one task.
func ReviewTaskFilter(id string) string { return reviewSubject + "*." + id }

// IndexSubject is where intake files a new task in the task index (the task
// explorer's list): one message per task, its type and a key of its subject
// as tokens, so a reader filters by them on the server.
func IndexSubject(taskType, subject string) string {
	return IndexRoot + "." + taskType + "." + SubjectKey(subject)
}

// IndexFilterFor matches the index entries of a type and a subject; an
// empty argument matches any.
func IndexFilterFor(taskType, subject string) string {
	t, k := "*", "*"
	if taskType != "" {
		t = taskType
	}
	if subject != "" {
		k = SubjectKey(subject)
	}
	return IndexRoot + "." + t + "." + k
}

// SubjectKey is a task subject (a path, a URL: any text) as one subject
// token: the first 16 hex digits of its SHA-256. Two subjects may share a
// key: a reader compares the subject itself too.
func SubjectKey(subject string) string {
	sum := sha256.Sum256([]byte(subject))
	return hex.EncodeToString(sum[:8])
}

// IndexEntry is the body of a task index message (task.indexed.v1).
type IndexEntry struct {
	ID          string    `json:"id"`
	Type        string    `json:"type"`
	Subject     string    `json:"subject"`
	SubmittedAt time.Time `json:"submitted_at"`
}

// ParseSubmitSubject reads the <type> token of dispatch.submit.<type>: all
// of the rest of the subject, valid type or not (DecodeSubmit checks it).
// ok is false for any other subject, bare dispatch.submit included.
func ParseSubmitSubject(subject string) (taskType string, ok bool) {
	taskType, ok = strings.CutPrefix(subject, SubmitRoot+".")
	if !ok || taskType == "" {
		return "", false
	}
	return taskType, true
}

// ParseTaskSubject splits dispatch.task.<id>.<stage>.
func ParseTaskSubject(subject string) (id, stage string, ok bool) {
	rest, found := strings.CutPrefix(subject, TaskRoot+".")
	if !found {
		return "", "", false
	}
	id, stage, found = strings.Cut(rest, ".")
	if !found || id == "" || stage == "" || strings.Contains(stage, ".") {
		return "", "", false
	}
	return id, stage, true
}

// ParseReviewSubject splits dispatch.review.<reason>.<key>.
func ParseReviewSubject(subject string) (reason, key string, ok bool) {
	rest, found := strings.CutPrefix(subject, reviewSubject)
	if !found {
		return "", "", false
	}
	reason, key, found = strings.Cut(rest, ".")
	if !found || reason == "" || key == "" || strings.Contains(key, ".") {
		return "", "", false
	}
	return reason, key, true
}

// Headers carried by every message the mesh publishes.
const (
	HeaderEvent    = "Dispatch-Event"   // versioned event name, e.g. task.queued.v1
	HeaderTaskID   = "Dispatch-Task-Id" // the task the message belongs to
	HeaderPass     = "Dispatch-Pass"    // the task's pass the message belongs to (decimal)
	HeaderReason   = "Dispatch-Reason"  // review reason (rejected, gated, …)
	HeaderError    = "Dispatch-Error"   // human-readable error text
	HeaderService  = "Dispatch-Service" // service instance that published it
	HeaderOrigSubj = "Dispatch-Orig-Subject"
	HeaderOrigSeq  = "Dispatch-Orig-Seq"
	// A record that keeps only the first MaxKeptBody bytes of what it
	// records says how long the original was and its SHA-256 (hex).
	HeaderOrigSize   = "Dispatch-Orig-Size"
	HeaderOrigSHA256 = "Dispatch-Orig-Sha256"
)
