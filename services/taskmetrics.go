package services

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"dispatchmesh/events"
)

// TaskMetrics count tasks as they end, whichever service ends them: the
// recorder (succeeded, blocked, failed), the gate (needs_human_review,
// blocked) and the verifier (cancelled). A service calls Finish only for the
// change it made itself, so a redelivery counts nothing. The zero value and
// a nil *TaskMetrics count nothing.
type TaskMetrics struct {
	finished *prometheus.CounterVec   // type, status
	latency  *prometheus.HistogramVec // type, status
}

// NewTaskMetrics returns the task metrics, registered on reg (shared by the
// services of one process); nil reg: kept but not registered.
func NewTaskMetrics(reg prometheus.Registerer) *TaskMetrics {
	m := &TaskMetrics{
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dispatch_tasks_finished_total",
			Help: "Tasks that ended, by type and status (succeeded, blocked, failed, needs_human_review, cancelled).",
		}, []string{"type", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dispatch_task_seconds",
			Help:    "Time from a task's submission to its end, by type and status.",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 12), // 5ms … ≈ 5.8h
		}, []string{"type", "status"}),
	}
	if reg != nil {
		m.finished = Register(reg, m.finished)
		m.latency = Register(reg, m.latency)
	}
	return m
}

// Finish counts a task of taskType that ended with status, took after its
// submission.
func (m *TaskMetrics) Finish(taskType string, status events.Status, took time.Duration) {
	if m == nil || m.finished == nil {
		return
	}
	m.finished.WithLabelValues(taskType, string(status)).Inc()
	m.latency.WithLabelValues(taskType, string(status)).Observe(max(took, 0).Seconds())
}
