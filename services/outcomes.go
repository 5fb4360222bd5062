package services

import "context"

// Outcomes counts what becomes of each message, by the Result of its
// *Fate (ResultOK when next succeeds): in dispatch_messages_total and in
// stats (handled, errors). ResultNone counts nothing. Either may be nil.
func Outcomes(metrics *Metrics, stats *RunStats, service string) Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, m *Msg) ([]Out, error) {
			outs, err := next(ctx, m)
			if r := FateOf(err).Result; r != ResultNone {
				metrics.count(service, r)
				stats.settled(r)
			}
			return outs, err
		}
	}
}
