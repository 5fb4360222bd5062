package services_test

import (
	"context"
	"slices"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/services"
)

// The first middleware is the outermost: it sees the message first and
// the result last.
func TestChainOrder(t *testing.T) {
	var trace []string
	mw := func(name string) services.Middleware {
		return func(next services.Handler) services.Handler {
			return func(ctx context.Context, m *services.Msg) ([]services.Out, error) {
				trace = append(trace, name+" in")
				outs, err := next(ctx, m)
				trace = append(trace, name+" out")
				return outs, err
			}
		}
	}
	h := services.Chain(func(context.Context, *services.Msg) ([]services.Out, error) {
		trace = append(trace, "handler")
		return nil, nil
	}, mw("a"), mw("b"))
	if _, err := h(context.Background(), &services.Msg{}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a in", "b in", "handler", "b out", "a out"}; !slices.Equal(trace, want) {
		t.Fatalf("trace %v, want %v", trace, want)
	}
	if h := services.Chain(nil); h != nil {
		t.Fatal("an empty chain is not the handler itself")
	}
}
