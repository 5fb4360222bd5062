package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/task"
	"github.com/dispatchmesh/dispatchmesh/internal/mesh"
)

// BenchmarkClientAPIWaits holds 1,000 concurrent HTTP waits (?wait=60s)
// on the client API, each on a task of its own that is pending, then
// settles every task (its state set to succeeded, as the recorder would)
// and times how long after its own settle each wait is answered.
//
// Reported per iteration: heap bytes per wait held (Go heap in use with
// all 1,000 held, less before; everything in this one process: the HTTP
// client's connections, the web server's handlers, the NATS requests, and
// intake's 1,000 waits — each a KV watch — and the embedded NATS server's
// subscriptions and consumers), goroutines per wait, and the p50 and max
// of the delay from a task's settle to its answer. The mesh runs intake
// only: nothing else touches the tasks.
//
//	go test -run '^$' -bench ClientAPIWaits -benchtime 1x ./internal/ops/web/
func BenchmarkClientAPIWaits(b *testing.B) {
	const n = 1000
	m := newAPIMesh(b, n+24, mesh.Intake)
	transport := &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: 0}
	defer transport.CloseIdleConnections()
	httpc := &http.Client{Transport: transport}
	ctx := context.Background()

	for iter := range b.N {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("bench-%d-%d", iter, i)
			tk := events.Task{ID: ids[i], Type: "css_fix", Subject: "src/app.css", SubmittedAt: time.Now().UTC()}
			if _, _, err := m.tasks.Create(ctx, task.Queued(tk, events.Run{Pass: 1}, 0)); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		goroutines := runtime.NumGoroutine()

		answered := make([]time.Time, n)
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(ctx, "GET", m.http.URL+"/api/v1/tasks/"+id+"?wait=60s", nil)
				req.Header.Set("Authorization", "Bearer "+clientToken)
				resp, err := httpc.Do(req)
				if err != nil {
					errs <- err
					return
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				answered[i] = time.Now()
				var wr events.WaitReply
				if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &wr) != nil || wr.Status != events.StatusSucceeded || wr.TimedOut {
					errs <- fmt.Errorf("wait %s: %d %s", id, resp.StatusCode, body)
				}
			}()
		}
		// Held: the gateway counts its places (a deadlock guard bounds it).
		deadline := time.Now().Add(patience)
		for m.handler.ClientWaits() < n {
			if time.Now().After(deadline) {
				b.Fatalf("only %d of %d waits held", m.handler.ClientWaits(), n)
			}
			select {
			case err := <-errs:
				b.Fatal(err)
			default:
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Intake's side of each: its KV watch of the task, started.
		time.Sleep(500 * time.Millisecond)
		runtime.GC()
		var held runtime.MemStats
		runtime.ReadMemStats(&held)
		perWait := (float64(held.HeapInuse) - float64(before.HeapInuse)) / n
		perWaitG := float64(runtime.NumGoroutine()-goroutines) / n

		settled := make([]time.Time, n)
		for i, id := range ids {
			settled[i] = time.Now()
			if _, err := m.tasks.Update(ctx, id, func(st *events.TaskState, found bool) error {
				st.Status = events.StatusSucceeded
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		delays := make([]time.Duration, n)
		for i := range delays {
			delays[i] = answered[i].Sub(settled[i])
		}
		slices.Sort(delays)
		b.ReportMetric(perWait, "heap-B/wait")
		b.ReportMetric(perWaitG, "goroutines/wait")
		b.ReportMetric(float64(delays[n/2].Microseconds())/1000, "p50-ms-after-settle")
		b.ReportMetric(float64(delays[n-1].Microseconds())/1000, "max-ms-after-settle")
	}
}
