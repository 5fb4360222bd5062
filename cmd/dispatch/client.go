package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/dispatchmesh/dispatchmesh/client"
	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/textcut"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/timeline"
	"github.com/dispatchmesh/dispatchmesh/schemas"
)

var stdout io.Writer = os.Stdout

// stderr is where commands write what is not their output (tests replace it).
var stderr io.Writer = os.Stderr

// cliConn names the connection of the one-shot commands (submit, status,
// tasks, review, audit, policy, stats, rebuild): NATS user "client" by
// default. Long-running processes connect under other names (the review
// page as "web", a service as itself).
const cliConn = "client"

// oneShot reports whether nc is a one-shot command's connection.
func oneShot(nc *nats.Conn) bool { return nc != nil && nc.Opts.Name == cliConn }

func clientJS(cfg Config) (jetstream.JetStream, func(), error) {
	nc, err := cfg.connect("", cliConn)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, nc.Close, nil
}

// meshClient connects as the "client" NATS user and returns the Go client.
func meshClient(cfg Config) (*client.Client, func(), error) {
	nc, err := cfg.connect("", cliConn)
	if err != nil {
		return nil, nil, err
	}
	c, err := client.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return c, nc.Close, nil
}

func cmdSubmit(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("submit", flag.ContinueOnError)
	typ := fs.String("type", "", "task type (required), e.g. css_fix")
	subject := fs.String("subject", "", "what the task is about (required): a file, a ticket, a URL")
	payload := fs.String("payload", "", "JSON payload for the prompt template")
	id := fs.String("id", "", "task id (default: generated); the same id twice makes one task")
	maxRetries := fs.Int("max-retries", 0, "attempts before a human is asked (default and at most: the type's)")
	wait := fs.Bool("wait", false, "print each stage as it happens, then the outcome; exit non-zero unless the task succeeds")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long -wait waits")
	every := fs.Duration("progress", 5*time.Second, "how often -wait says which stage the task is at and for how long (0: never)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	task := client.Task{ID: *id, Type: *typ, Subject: *subject, MaxRetries: *maxRetries}
	if *payload != "" {
		if err := payloadJSON(*payload); err != nil {
			return &exitError{1, err}
		}
		task.Payload = json.RawMessage(*payload)
	}
	if task.ID == "" {
		task.ID = nuid.Next()
	}
	c, closeFn, err := meshClient(cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	sub, err := c.Submit(ctx, task)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, sub.ID)
	if !*wait {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	return waitFor(wctx, stdout, c, sub.ID, *every)
}

// payloadJSON checks -payload is one JSON value, and says what is wrong
// with it in the terms of the command line: where in the text, and what
// was found there. (Left to the encoder, a bad payload fails as
// "json: error calling MarshalJSON for type json.RawMessage".)
func payloadJSON(p string) error {
	var v any
	dec := json.NewDecoder(strings.NewReader(p))
	err := dec.Decode(&v)
	if err == nil {
		end := dec.InputOffset()
		if _, terr := dec.Token(); terr != io.EOF {
			return fmt.Errorf("-payload is not one JSON value: it goes on after byte %d (%q); quote it whole, e.g. -payload '{\"issue\":\"button misaligned\"}'", end, clip(strings.TrimSpace(p[end:]), 20))
		}
		return nil
	}
	var syn *json.SyntaxError
	at := ""
	if errors.As(err, &syn) {
		at = fmt.Sprintf(" at byte %d", syn.Offset)
	}
	msg := strings.TrimPrefix(err.Error(), "json: ")
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		msg = "it ends before the JSON value does"
	}
	return fmt.Errorf("-payload is not JSON%s: %s (%q); give a JSON value, e.g. -payload '{\"issue\":\"button misaligned\"}'", at, msg, clip(p, 40))
}

// clip shortens s to n bytes for a message.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// waitFor prints the task's events as they happen and, every `every` while
// nothing happens, the stage the task is at and for how long (0: never);
// then its outcome and final answer. A non-success end is an exit code 1, a
// timeout 2.
func waitFor(ctx context.Context, w io.Writer, c *client.Client, id string, every time.Duration) error {
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	evs := make(chan client.Event)
	watched := make(chan error, 1)
	go func() {
		watched <- c.Watch(wctx, id, func(e client.Event) bool {
			select {
			case evs <- e:
			case <-wctx.Done():
				return false
			}
			final, _ := e.Final()
			return !final
		})
	}()
	var tick <-chan time.Time
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	p := newProgress(w)
	start := time.Now()
	var last client.Event // the latest event: the stage the task is at
	var err error
	for watching := true; watching; {
		select {
		case e := <-evs:
			last = e
			en := timeline.Entry{Seq: e.Seq, Time: e.Time, Event: e.Name, Stage: e.Stage, By: e.By, Error: e.Error, Data: e.Data}
			p.line(fmt.Sprintf("%s  %-18s %s", e.Time.Local().Format("15:04:05.000"), e.Stage, en.Summary()))
		case <-tick:
			p.status(stillAt(last, start, time.Now()))
		case err = <-watched:
			watching = false
		}
	}
	p.done()
	if err != nil && ctx.Err() == nil {
		return err
	}
	if ctx.Err() != nil {
		return &exitError{2, fmt.Errorf("task %s: gave up waiting at stage %s", id, orUnknown(last.Stage))}
	}
	out, err := c.Wait(ctx, id) // the task has ended: answered at once
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return &exitError{2, fmt.Errorf("task %s: gave up waiting: %w", id, err)}
	case err != nil:
		return err
	}
	printOutcome(w, out)
	if out.Status != events.StatusSucceeded {
		return &exitError{1, fmt.Errorf("task %s ended %s", id, out.Status)}
	}
	return nil
}

// stillAt says where a waited-for task stands at now: the stage of its
// latest event and how long ago that was stored, or, before its first
// event, how long the wait has lasted.
func stillAt(last client.Event, start, now time.Time) string {
	if last.Stage == "" {
		return fmt.Sprintf("waiting for the task to start for %s", now.Sub(start).Round(time.Second))
	}
	return fmt.Sprintf("still at stage %s for %s", last.Stage, max(now.Sub(last.Time), 0).Round(time.Second))
}

// progress writes -wait's lines. On a terminal the status line is
// rewritten in place (\r) and erased before the next event; elsewhere
// (a pipe, a file, a log) every status is a line of its own.
type progress struct {
	w       io.Writer
	tty     bool
	showing bool // a status line is on screen, without its newline
}

func newProgress(w io.Writer) *progress {
	f, ok := w.(*os.File)
	if !ok {
		return &progress{w: w}
	}
	fi, err := f.Stat()
	return &progress{w: w, tty: err == nil && fi.Mode()&os.ModeCharDevice != 0}
}

// line prints s as a line of its own.
func (p *progress) line(s string) {
	p.done()
	fmt.Fprintln(p.w, printable(s))
}

// status shows s until the next line.
func (p *progress) status(s string) {
	if !p.tty {
		fmt.Fprintln(p.w, printable(s))
		return
	}
	fmt.Fprintf(p.w, "\r%s\x1b[K", oneLine(s, 1<<10))
	p.showing = true
}

// done erases the status line on a terminal.
func (p *progress) done() {
	if p.showing {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.showing = false
	}
}

// printOutcome prints a finished task's status, cost and final answer.
func printOutcome(w io.Writer, out client.Outcome) {
	fmt.Fprintf(w, "%s after %d attempt(s), %d+%d tokens, $%.4f\n", out.Status, out.Attempts, out.TokensIn, out.TokensOut, out.Cost)
	if out.Reason != "" {
		fmt.Fprintf(w, "reason: %s\n", printable(out.Reason))
	}
	printResult(w, out.Result)
}

// printResult prints a succeeded task's final answer (nothing for nil).
func printResult(w io.Writer, r *client.Result) {
	if r == nil {
		return
	}
	if r.Approach != "" {
		fmt.Fprintf(w, "approach: %s\n", printable(r.Approach))
	}
	if r.Summary != "" {
		fmt.Fprintf(w, "summary: %s\n", printable(r.Summary))
	}
	for _, ch := range r.Changes {
		fmt.Fprintf(w, "change: %s\n", printable(ch))
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

const statusUsage = `usage: dispatch status [-v] ID [-o json]
  a task's current state; -v adds its payload and every attempt's answer (approach, summary, changes,
  error, model, tokens, cost, how long it took), as the task page (/tasks/ID) shows them`

func cmdStatus(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	output := outputFlag(fs)
	verbose := fs.Bool("v", false, "also the payload and every attempt's answer, read from the task's events on the stream")
	pos, err := parseArgs(fs, args) // flags before or after ID
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New(statusUsage)
	}
	id := pos[0]
	if !events.ValidID(id) {
		return fmt.Errorf("invalid task id %q: 1-%d characters of A-Z, a-z, 0-9, _ or -", id, events.MaxIDLen)
	}
	nc, err := cfg.connect("", cliConn)
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		return err
	}
	st, err := c.Status(ctx, id)
	if err != nil {
		return err
	}
	// A finished task's final answer: the wait API answers at once.
	var result *client.Result
	if events.Terminal(st.Status) {
		wctx, cancel := context.WithTimeout(ctx, client.DefaultRequestTimeout)
		out, err := c.Wait(wctx, st.ID)
		cancel()
		if err != nil {
			return fmt.Errorf("task %s is %s; its final answer: %w", st.ID, st.Status, err)
		}
		result = out.Result
	}
	var story *taskStory
	if *verbose {
		if story, err = readStory(ctx, cfg, nc, st.ID); err != nil {
			return err
		}
	}
	if *output == "json" {
		v := statusJSON{State: st, Result: result}
		if story != nil {
			return writeJSON(stdout, statusVerboseJSON{statusJSON: v, Payload: story.Payload, Answers: story.Answers})
		}
		return writeJSON(stdout, v)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "id\t%s\ntype\t%s\nsubject\t%s\nstatus\t%s\nattempts\t%d\n", st.ID, st.Type, oneLine(st.Subject, 1<<10), st.Status, st.Attempts)
	if st.Reason != "" {
		fmt.Fprintf(w, "reason\t%s\n", oneLine(st.Reason, 1<<10))
	}
	if st.LastError != "" {
		fmt.Fprintf(w, "last error\t%s\n", oneLine(st.LastError, 1<<10))
	}
	fmt.Fprintf(w, "tokens\t%d in, %d out\ncost\t$%.4f\ncreated\t%s\nupdated\t%s\n", st.TokensIn, st.TokensOut, st.Cost,
		st.CreatedAt.Local().Format(time.RFC3339), st.UpdatedAt.Local().Format(time.RFC3339))
	for _, a := range st.History {
		fmt.Fprintf(w, "attempt %d\t%s %s %s\n", a.Attempt, a.Outcome, a.Rung, oneLine(strings.TrimSpace(a.Approach+" "+a.Reason), 1<<10))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	printResult(stdout, result)
	if story != nil {
		printStory(stdout, *story)
	}
	return nil
}

// oneLine is s on one line, at most n bytes (cut at a rune boundary),
// every control character a space: text from a model, a tool or a task
// cannot move the cursor, hide itself or talk to the terminal.
func oneLine(s string, n int) string {
	return textcut.Clip(blankControls(s, false), n)
}

// printable is s with every control character but a newline or a tab
// replaced by a space (see oneLine), for text printed as it came.
func printable(s string) string { return blankControls(s, true) }

// blankControls replaces every control character of s with a space, but
// newlines and tabs when lines is set.
func blankControls(s string, lines bool) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) && !(lines && (r == '\n' || r == '\t')) {
			return ' '
		}
		return r
	}, s)
}

func cmdSchema(args []string) error {
	if len(args) == 0 {
		for _, n := range schemas.Names() {
			fmt.Fprintln(stdout, n)
		}
		return nil
	}
	b, err := schemas.Get(args[0])
	if err != nil {
		return err
	}
	_, err = stdout.Write(b)
	return err
}

// outputFlag is the -o flag: text or json, anything else is an error.
func outputFlag(fs *flag.FlagSet) *string {
	o := outputValue("text")
	fs.Var(&o, "o", "output: text or json")
	return (*string)(&o)
}

type outputValue string

func (o *outputValue) String() string { return string(*o) }

func (o *outputValue) Set(s string) error {
	if s != "text" && s != "json" {
		return fmt.Errorf("output must be text or json, not %q", s)
	}
	*o = outputValue(s)
	return nil
}
