package webhook

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of one try, the result label of dispatch_webhook_tries_total.
const (
	resultDelivered = "delivered" // the receiver answered 2xx
	resultRetried   = "retried"   // failed, tried again later
	resultFailed    = "failed"    // given up: its last try, or a URL not allowed
)

type metrics struct {
	due   prometheus.Counter
	tries *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		due: prometheus.NewCounter(prometheus.CounterOpts{Name: "dispatch_webhook_due_total",
			Help: "Deliveries filed: settlements of tasks with a callback URL."}),
		tries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dispatch_webhook_tries_total",
			Help: "Webhook delivery tries by result: delivered, retried, failed (given up: a review record)."}, []string{"result"}),
	}
	for _, r := range []string{resultDelivered, resultRetried, resultFailed} {
		m.tries.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	// Another instance in this process registered them first: count there.
	var are prometheus.AlreadyRegisteredError
	if err := reg.Register(m.due); errors.As(err, &are) {
		m.due = are.ExistingCollector.(prometheus.Counter)
	} else if err != nil {
		return nil, err
	}
	if err := reg.Register(m.tries); errors.As(err, &are) {
		m.tries = are.ExistingCollector.(*prometheus.CounterVec)
	} else if err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) result(r string) { m.tries.WithLabelValues(r).Inc() }
