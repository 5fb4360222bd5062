package services

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Who ended a task: the by label of dispatch_tasks_finished_total and
// dispatch_task_seconds.
const (
	// EndedByRecorder: an attempt ended it (succeeded, blocked, failed).
	EndedByRecorder = "recorder"
	// EndedByGate: the gate stopped it (needs_human_review, blocked).
	EndedByGate = "gate"
	// EndedByVerifier: the verifier found it stale (cancelled), or a
	// fail_closed verifier failed.
	EndedByVerifier = "verifier"
	// EndedByHuman: a human resolved (succeeded), rejected (failed) or
	// cancelled (cancelled) it; counted by the recorder, which follows the
	// review actions.
	EndedByHuman = "human"
)

// TaskMetrics count tasks as they end, whichever service ends them: the
// recorder (succeeded, blocked, failed, and what a human's review action
// ended), the gate (needs_human_review, blocked) and the verifier
// (cancelled). A service calls Finish only for the change it made itself,
// so a redelivery counts nothing. Every end counts: a task a human resolves
// after the gate stopped it counts once by="gate" and once by="human". The
// zero value and a nil *TaskMetrics count nothing.
type TaskMetrics struct {
	finished *prometheus.CounterVec   // type, status, by
	latency  *prometheus.HistogramVec // type, status, by
	types    *LabelSet
}

// NewTaskMetrics returns the task metrics, registered on reg (shared by the
// services of one process); nil reg: kept but not registered. types bounds
// the type label: the services of one process share theirs.
func NewTaskMetrics(reg prometheus.Registerer, types *LabelSet) *TaskMetrics {
	m := &TaskMetrics{
		types: types,
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_tasks_finished_total",
			Help: "Tasks that ended, by type, status (succeeded, blocked, failed, needs_human_review, cancelled) and who ended them (by: recorder, gate, verifier, human).",
		}, []string{"type", "status", "by"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dispatch_task_seconds",
			Help:    "Time from a task's submission to its end, by type, status and who ended it (by).",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 12), // 5ms … ≈ 5.8h
		}, []string{"type", "status", "by"}),
	}
	if reg != nil {
		m.finished = Register(reg, m.finished)
		m.latency = Register(reg, m.latency)
	}
	return m
}

// Finish counts a task of taskType that ended with status, ended by by (an
// EndedBy constant), took after its submission.
func (m *TaskMetrics) Finish(taskType string, status events.Status, by string, took time.Duration) {
	if m == nil || m.finished == nil {
		return
	}
	typ := m.types.Label(taskType)
	m.finished.WithLabelValues(typ, string(status), by).Inc()
	m.latency.WithLabelValues(typ, string(status), by).Observe(max(took, 0).Seconds())
}
