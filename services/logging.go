package services

import (
	"context"
	"log/slog"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// Logging writes one line per message with its subject, stream sequence
// and delivery count: at debug level when it was handled or snoozed, else
// at the level of what becomes of it (the *Fate that DeadLetters returns):
// info for a message handed back at shutdown, warn for a retry or a
// dead-letter, error for poison and for a dead-letter that could not be
// published.
func Logging(log *slog.Logger) Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, m *Msg) ([]Out, error) {
			outs, err := next(ctx, m)
			attrs := []slog.Attr{slog.String("subject", m.Subject), slog.Uint64("seq", m.Seq), slog.Int("delivered", m.Delivered)}
			if err == nil {
				log.LogAttrs(ctx, slog.LevelDebug, "handled", append(attrs, slog.Int("outputs", len(outs)))...)
				return outs, nil
			}
			f := FateOf(err)
			level, text := slog.LevelWarn, "handler failed; retrying"
			switch {
			case f.Result == ResultSnoozed:
				level, text = slog.LevelDebug, "snoozed"
			case f.Result == ResultShutdown:
				level, text = slog.LevelInfo, "shutdown: handing message back"
			case f.Result == ResultDead && f.Reason == events.ReviewPoison:
				level, text = slog.LevelError, "sent to review"
			case f.Result == ResultDead:
				text = "sent to review"
			case f.Result == ResultNone:
				level, text = slog.LevelError, "dead-letter failed; retrying later"
			}
			attrs = append(attrs, slog.String("action", string(f.Action)))
			if f.Action == ActionNak {
				attrs = append(attrs, slog.Duration("delay", f.Delay))
			}
			if f.Reason != "" {
				attrs = append(attrs, slog.String("reason", f.Reason))
			}
			log.LogAttrs(ctx, level, text, append(attrs, slog.Any("err", f.Err))...)
			return outs, err
		}
	}
}
