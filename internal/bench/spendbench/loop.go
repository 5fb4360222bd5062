package spendbench

import (
	"context"
	"sync"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/ladder"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
	"github.com/dispatchmesh/dispatchmesh/services/prompt"
)

// RunLoop runs the tasks through the naive stateless loop the mesh is
// compared with: each task's prompt is the one the mesh sends on a first
// attempt with no history (the type's template, or prompt.DefaultTemplate,
// through prompt.Build), sent up to cfg.LoopTries times, cfg.LoopGap apart,
// until an answer parses as a success. Every error, transient or not, uses
// up a try; nothing of one try reaches the next. Tasks start as cfg.Mode
// delivers them, at most cfg.LoopConcurrency at a time.
func RunLoop(ctx context.Context, cfg Config, tasks []Task) (Figures, error) {
	cfg = cfg.withDefaults()
	pol, err := cfg.policy()
	if err != nil {
		return Figures{}, err
	}
	srv, err := StartServer(cfg.Latency)
	if err != nil {
		return Figures{}, err
	}
	defer srv.Close()
	model := executor.NewOpenAI(executor.OpenAIConfig{BaseURL: srv.BaseURL(), APIKey: "sk-spendbench"})

	// Render every prompt before the clock starts.
	reqs := make(map[string]executor.Request, len(tasks))
	for _, t := range tasks {
		tp := pol.For(t.TaskType())
		tmpl, err := prompt.Parse(orString(tp.Template, prompt.DefaultTemplate))
		if err != nil {
			return Figures{}, err
		}
		task := events.Task{ID: t.ID, Type: t.TaskType(), Subject: t.Subject, Payload: t.Payload, SubmittedAt: time.Now().UTC()}
		// The run of a new task's first attempt, as intake makes it.
		run := events.Run{Pass: 1, Attempt: 1, Rung: events.RungRefine, Step: ladder.FirstStep(tp.Steps)}
		msgs, err := prompt.Build(tmpl, prompt.NewData(events.Base{Task: task, Run: run}, nil))
		if err != nil {
			return Figures{}, err
		}
		reqs[t.ID] = executor.Request{
			Model: orString(tp.Model, cfg.Model), Messages: executor.PromptMessages(msgs),
			ResponseFormat: executor.ResponseFormatJSON, TaskType: t.TaskType(), TaskID: t.ID, Attempt: 1,
		}
	}

	var (
		mu       sync.Mutex
		outcomes = make(map[string]outcome, len(tasks))
		wg       sync.WaitGroup
		slots    = make(chan struct{}, cfg.LoopConcurrency)
	)
	start := time.Now()
	err = deliver(ctx, cfg, tasks, func(t Task) error {
		submitted := time.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-slots }()
			resolved := loopTask(ctx, cfg, model, reqs[t.ID])
			status := "gave_up"
			if resolved {
				status = string(events.StatusSucceeded)
			}
			seconds := time.Since(submitted).Seconds()
			mu.Lock()
			outcomes[t.ID] = outcome{status: status, resolved: resolved, ended: true, endRecords: 1, seconds: seconds}
			mu.Unlock()
		}()
		return nil
	})
	wg.Wait()
	wall := time.Since(start)
	if err != nil {
		return Figures{}, err
	}
	if ctx.Err() != nil {
		return Figures{}, ctx.Err()
	}
	for _, t := range tasks {
		if _, ok := outcomes[t.ID]; !ok {
			outcomes[t.ID] = outcome{status: "missing"}
		}
	}
	f := figures(RunnerLoop, cfg.Mode, tasks, outcomes, srv.Ledger(), srv.Unassigned())
	f.setWall(wall)
	return f, nil
}

// loopTask is the naive loop for one task: the same request up to
// cfg.LoopTries times, cfg.LoopGap apart, until a success.
func loopTask(ctx context.Context, cfg Config, model *executor.OpenAI, req executor.Request) bool {
	for try := range cfg.LoopTries {
		if try > 0 {
			select {
			case <-time.After(cfg.LoopGap):
			case <-ctx.Done():
				return false
			}
		}
		resp, err := model.Complete(ctx, req)
		if err != nil {
			continue
		}
		if r, err := executor.ParseResult(resp.Content); err == nil && r.Status == events.OutcomeSuccess {
			return true
		}
	}
	return false
}

// deliver hands each task to submit, all at once or at cfg.Rate per second.
func deliver(ctx context.Context, cfg Config, tasks []Task, submit func(Task) error) error {
	var tick *time.Ticker
	if cfg.Mode == ModeSteady {
		tick = time.NewTicker(time.Duration(float64(time.Second) / cfg.Rate))
		defer tick.Stop()
	}
	for i, t := range tasks {
		if tick != nil && i > 0 {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := submit(t); err != nil {
			return err
		}
	}
	return nil
}

func orString(v, def string) string {
	if v != "" {
		return v
	}
	return def
}
