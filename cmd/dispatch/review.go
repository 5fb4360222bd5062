package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
)

const reviewUsage = `usage:
  dispatch review list [-reason R] [-type T] [-age 24h] [-all] [-answered] [-limit N] [-cursor C] [-o json]
      newest first, a page at a time: a page ends with the command that prints the next (older) one;
      without -reason and -cursor it first lists the tasks held for their type's trust, oldest first
  dispatch review show ID [-o json]
  dispatch review resolve|reject|requeue ID... -note TEXT [-by WHO] [-type T] [-reason R]
      one decision, one note: on each task ID given, then (with -type and/or -reason) on every
      other open item of that type and review reason, each as a single decision, reported per item;
      ID@N acts only if the task still holds the N decisions you saw (review list -o json:
      "decisions"), so a decision another reviewer took meanwhile is named and stands; a bulk
      decision by -type/-reason applies the same check with the decisions each item was listed with`

// reviewClient connects to NATS_URL and returns a review client.
func reviewClient(cfg Config) (*review.Client, func(), error) {
	return newReviewClient(cfg, true)
}

// listClient is a review client for listing tasks only: it does not read
// the policy, so a user who may not read the policy bucket (client) can
// list tasks.
func listClient(cfg Config) (*review.Client, func(), error) {
	return newReviewClient(cfg, false)
}

func newReviewClient(cfg Config, withPolicy bool) (*review.Client, func(), error) {
	js, closeFn, err := clientJS(cfg)
	if err != nil {
		return nil, nil, err
	}
	// The page and `review show` give the thresholds of the policy in force.
	var pol *policy.Source
	if withPolicy {
		if pol, err = watchPolicy(context.Background(), js, cfg.logger()); err != nil {
			closeFn()
			return nil, nil, err
		}
	}
	rc, err := review.New(review.Config{JS: js, Policy: pol, Log: cfg.logger()})
	if err != nil {
		closeFn()
		return nil, nil, err
	}
	// The client's trust view stops before the connection closes.
	return rc, func() { rc.Close(); closeFn() }, nil
}

// parseArgs parses flags wherever they stand among the positional
// arguments (`show ID -o json` as well as `show -o json ID`).
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func cmdReview(ctx context.Context, cfg Config, args []string) error {
	if len(args) == 0 {
		return errors.New(reviewUsage)
	}
	switch args[0] {
	case "list":
		return reviewList(ctx, cfg, args[1:])
	case "show":
		return reviewShow(ctx, cfg, args[1:])
	case events.ActionResolve, events.ActionReject, events.ActionRequeue:
		return reviewAct(ctx, cfg, args[0], args[1:])
	}
	return fmt.Errorf("unknown review command %q\n%s", args[0], reviewUsage)
}

func reviewList(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("review list", flag.ContinueOnError)
	var f review.Filter
	fs.StringVar(&f.Reason, "reason", "", "only this reason: "+strings.Join(review.Reasons, ", "))
	fs.StringVar(&f.Type, "type", "", "only this task type")
	fs.DurationVar(&f.Age, "age", 0, "only records from the last AGE (e.g. 24h)")
	fs.BoolVar(&f.All, "all", false, "also list items a human already handled")
	fs.BoolVar(&f.Answered, "answered", false, "also list rejections the submit API already answered to its caller")
	fs.IntVar(&f.Limit, "limit", review.DefaultPageSize, fmt.Sprintf("items per page (at most %d)", review.MaxPageSize))
	fs.StringVar(&f.Cursor, "cursor", "", "continue after the previous page (its cursor)")
	output := outputFlag(fs)
	if pos, err := parseArgs(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("review list takes no arguments, got %q\n%s", pos, reviewUsage)
	}
	if err := f.Validate(); err != nil {
		return err
	}
	rc, closeFn, err := reviewClient(cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	q, err := rc.List(ctx, f)
	if err != nil {
		return err
	}
	// The held tasks are on no review subject: the first page of every
	// reason lists them from the gate's held index.
	if f.ListsHeld() {
		if hl, err := rc.Held(ctx, f.Type); err != nil {
			fmt.Fprintf(stderr, "warning: the held tasks could not be read: %v\n", err)
		} else {
			q.Held = &hl
		}
	}
	if *output == "json" {
		return writeJSON(stdout, q)
	}
	if q.Held != nil {
		printHeld(stdout, *q.Held)
	}
	printQueue(stdout, q, f, args)
	return nil
}

// printHeld prints the tasks the gate holds for their type's trust, oldest
// first, with when each goes to a human.
func printHeld(out io.Writer, hl review.HeldList) {
	if len(hl.Items) == 0 && hl.Total == 0 {
		fmt.Fprintln(out, "No task is held for its type's trust.")
		fmt.Fprintln(out)
		return
	}
	from := "each type's hold time in the policy in force"
	if hl.HoldTimeFrom != review.HoldTimeFromPolicy {
		from = "the default hold time; a type's hold_time in the policy may differ"
	}
	fmt.Fprintf(out, "HELD for their type's low trust, oldest first: each is re-admitted when its type recovers, else goes to a human at TO HUMAN (%s).\n", from)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SINCE\tTASK\tTYPE\tPASS\tTO HUMAN\tWHY")
	for _, it := range hl.Items {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", it.Since.Local().Format("2006-01-02 15:04:05"), it.TaskID, it.Type, it.Pass,
			it.ToHuman.Local().Format("2006-01-02 15:04:05"), oneLine(it.Reason, 100))
	}
	_ = w.Flush()
	what := fmt.Sprintf("%d held", len(hl.Items))
	switch {
	case !hl.Complete:
		what += fmt.Sprintf(", the oldest of at least %d (the listing stops after reading %d messages of the held index)", hl.Total, hl.Scanned)
	case hl.Total > len(hl.Items)+hl.MovedOn:
		what += fmt.Sprintf(", the oldest of %d", hl.Total)
	}
	if hl.MovedOn > 0 {
		what += fmt.Sprintf("; %d whose task moved on since (a human acted) left out", hl.MovedOn)
	}
	fmt.Fprintf(out, "%s. A human may act on a held task: dispatch review resolve|reject|requeue ID -note TEXT.\n\n", what)
}

// printQueue prints one page of the queue, what it read, and the command
// that prints the next page.
func printQueue(out io.Writer, q review.Queue, f review.Filter, args []string) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TIME\tREASON\tTASK\tTYPE\tSTATUS\tWHY")
	for _, it := range q.Items {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", it.Time.Local().Format("2006-01-02 15:04:05"), it.Reason, it.Key,
			dash(it.Type), dash(string(it.Status)), oneLine(it.Error, 100))
		if a := it.Handled; a != nil {
			fmt.Fprintf(w, "\t\t\t\t\t↳ handled: %s by %s at %s: %s\n", a.Action, a.By, a.At.Local().Format("2006-01-02 15:04:05"), oneLine(a.Note, 80))
		}
	}
	_ = w.Flush()
	if len(q.Items) == 0 {
		if q.Next != "" {
			fmt.Fprintln(out, "(no item matches on this page)")
		} else {
			fmt.Fprintln(out, "(no item matches)")
		}
	}
	what := "open item"
	if f.All {
		what = "item"
	}
	if len(q.Items) != 1 {
		what += "s"
	}
	read := "review records"
	if f.Reason == "" {
		read = "review records and human decisions"
	}
	fmt.Fprintf(out, "\n%d %s, newest first; this page read %d %s", len(q.Items), what, q.Scanned, read)
	if f.Filtered() {
		fmt.Fprintf(out, " (open, answered and type are read per record: a page reads at most %d per item and may stop early)", review.QueueScanFactor)
	}
	fmt.Fprintln(out, ".")
	if !f.All {
		fmt.Fprintln(out, "Items a human already handled are hidden; -all lists them.")
	}
	fmt.Fprintf(out, "%s.\n", q.Retention)
	if q.Next != "" {
		fmt.Fprintf(out, "\nolder: %s\n", nextCommand("dispatch review list", args, q.Next))
	}
}

// nextCommand is the command line that prints the page after cursor: the
// same arguments, their -cursor replaced.
func nextCommand(command string, args []string, cursor string) string {
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "-cursor" || a == "--cursor" {
			i++
			continue
		}
		if strings.HasPrefix(a, "-cursor=") || strings.HasPrefix(a, "--cursor=") {
			continue
		}
		rest = append(rest, shellQuote(a))
	}
	return strings.TrimSpace(command + " " + strings.Join(append(rest, "-cursor", cursor), " "))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func reviewShow(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("review show", flag.ContinueOnError)
	output := outputFlag(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("usage: dispatch review show ID [-o json]")
	}
	rc, closeFn, err := reviewClient(cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	d, err := rc.Show(ctx, pos[0])
	if err != nil {
		return err
	}
	if *output == "json" {
		return writeJSON(stdout, d)
	}
	printDetail(stdout, d)
	return nil
}

func printDetail(out io.Writer, d review.Detail) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "task\t%s\n", d.ID)
	if st := d.Task; st != nil {
		fmt.Fprintf(w, "type\t%s\nsubject\t%s\nstatus\t%s\n", st.Type, oneLine(st.Subject, 1<<10), st.Status)
	}
	fmt.Fprintf(w, "why\t%s\n", oneLine(d.Why, 1<<10))
	if t := d.Trust; t != nil {
		gate := "open"
		switch {
		case t.Exempt:
			gate = "exempt"
		case t.Gated:
			gate = "GATED"
		case t.Outcomes < t.MinOutcomes:
			gate = fmt.Sprintf("not judged under %d outcomes", t.MinOutcomes)
		}
		fmt.Fprintf(w, "trust\t%s %.2f over %d outcomes, threshold %.2f: %s; recent %s\n", t.Type, t.Score, t.Outcomes, t.Threshold, gate, dots(t))
	}
	if st := d.Task; st != nil {
		fmt.Fprintf(w, "spent\t%d attempts, %d tokens in, %d out, $%.4f\n", st.Attempts, st.TokensIn, st.TokensOut, st.Cost)
	}
	if d.Actionable {
		acts := "resolve, reject"
		if d.CanRequeue {
			acts += ", requeue"
		}
		fmt.Fprintf(w, "actions\t%s (dispatch review <action> %s -note TEXT)\n", acts, d.ID)
		if d.NoRequeue != "" {
			fmt.Fprintf(w, "requeue\tnot possible: %s\n", d.NoRequeue)
		}
	} else {
		fmt.Fprintf(w, "actions\tnone now: %s\n", d.NotActionable)
	}
	_ = w.Flush()

	if len(d.Attempts) > 0 {
		fmt.Fprintln(out, "\nATTEMPTS")
		w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "#\tPASS\tRUNG\tSTEP\tAPPROACH\tOUTCOME\tREASON\tTOKENS\tCOST")
		for _, a := range d.Attempts {
			fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%d/%d\t$%.4f\n", a.Attempt, a.Pass, dash(string(a.Rung)), dash(a.Step),
				oneLine(a.Approach, 50), a.Outcome, oneLine(dash(a.Reason), 70), a.TokensIn, a.TokensOut, a.Cost)
		}
		_ = w.Flush()
	}
	if len(d.DeadEnds) > 0 {
		fmt.Fprintln(out, "\nDEAD ENDS (approaches not to repeat)")
		w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ATTEMPT\tRUNG\tAPPROACH\tREASON")
		for _, de := range d.DeadEnds {
			attempt := strconv.Itoa(de.Attempt)
			if de.Attempt == 0 {
				attempt = "earlier task"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", attempt, dash(string(de.Rung)), oneLine(de.Approach, 60), oneLine(de.Reason, 80))
		}
		_ = w.Flush()
	}
	if len(d.Records) > 0 {
		fmt.Fprintln(out, "\nREVIEW RECORDS AND HUMAN ACTIONS")
		w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "SEQ\tTIME\tRECORD\tBY\tWHAT")
		for _, r := range d.Records {
			what := r.Error
			if r.Action != nil {
				what = r.Action.Action + ": " + r.Action.Note
			} else if r.Raw != "" {
				what += " | original: " + r.Raw
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", r.Seq, r.Time.Local().Format("2006-01-02 15:04:05"), r.Reason, dash(r.By), oneLine(what, 110))
		}
		_ = w.Flush()
	}
}

// dots draws recent outcomes oldest first: + success, x failure.
func dots(t *review.TrustView) string {
	var b strings.Builder
	for _, o := range t.Recent {
		if o.Success {
			b.WriteByte('+')
		} else {
			b.WriteByte('x')
		}
	}
	if b.Len() == 0 {
		return "(none)"
	}
	return b.String()
}

func reviewAct(ctx context.Context, cfg Config, action string, args []string) error {
	fs := flag.NewFlagSet("review "+action, flag.ContinueOnError)
	note := fs.String("note", "", "why (required); a requeue's note reaches the next prompt")
	by := fs.String("by", review.DefaultBy(), "who acts")
	var typ, reason string
	fs.StringVar(&typ, "type", "", "bulk: "+action+" every open item of this task type")
	fs.StringVar(&reason, "reason", "", "bulk: "+action+" every open item of this review reason")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 && typ == "" && reason == "" {
		return fmt.Errorf("review %s needs a task ID (or several), or -type/-reason\n%s", action, reviewUsage)
	}
	b := review.Bulk{Action: action, Type: typ, Reason: reason, Note: *note, By: *by}
	for _, p := range pos {
		t, err := review.ParseTarget(p)
		if err != nil {
			return err
		}
		b.Targets = append(b.Targets, t)
	}
	rc, closeFn, err := reviewClient(cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	if len(b.Targets) == 1 && b.Type == "" && b.Reason == "" {
		t := b.Targets[0]
		d, err := rc.DecideSeen(ctx, action, t.ID, *note, *by, t.Seen)
		if err != nil {
			return err
		}
		status := "record closed"
		if d.Task != nil {
			status = "status " + string(d.Task.Status)
		}
		fmt.Fprintf(stdout, "%s: %s by %s (%s)\n", t.ID, action, d.Action.By, status)
		return nil
	}
	return reviewBulk(ctx, rc, b)
}

// reviewBulk carries out a bulk decision, printing each item as it is done:
// the queue is read a page at a time, however many items match.
func reviewBulk(ctx context.Context, rc *review.Client, b review.Bulk) error {
	done, left := 0, 0
	err := rc.DecideBulk(ctx, b, func(it review.BulkItem) {
		switch {
		case it.Done:
			done++
			fmt.Fprintf(stdout, "%s %s%s\n", pastTense(b.Action), it.ID, dashStatus(it.Status))
		case it.DecidedBy != "":
			left++
			fmt.Fprintf(stdout, "skipped %s: %s decided it since (theirs stands): %s\n", it.ID, it.DecidedBy, it.Why)
		default:
			left++
			fmt.Fprintf(stdout, "skipped %s: %s\n", it.ID, it.Why)
		}
	})
	fmt.Fprintf(stdout, "%d %s, %d skipped\n", done, pastTense(b.Action), left)
	if err != nil {
		return err
	}
	if left > 0 {
		return &exitError{1, fmt.Errorf("%d of %d items were not %s", left, left+done, pastTense(b.Action))}
	}
	return nil
}

func pastTense(action string) string {
	switch action {
	case events.ActionResolve:
		return "resolved"
	case events.ActionReject:
		return "rejected"
	}
	return "requeued"
}

func dashStatus(st events.Status) string {
	if st == "" {
		return ""
	}
	return " (status " + string(st) + ")"
}

func cmdAudit(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	output := outputFlag(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("usage: dispatch audit ID [-o json]")
	}
	rc, closeFn, err := reviewClient(cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	a, err := rc.Audit(ctx, pos[0])
	if err != nil {
		return err
	}
	if *output == "json" {
		return writeJSON(stdout, a)
	}
	printAudit(stdout, a)
	return nil
}

func printAudit(out io.Writer, a review.Audit) {
	if st := a.Task; st != nil {
		fmt.Fprintf(out, "task %s: %s on %s, status %s", a.ID, st.Type, oneLine(st.Subject, 1<<10), st.Status)
		if st.Reason != "" {
			fmt.Fprintf(out, " (%s)", oneLine(st.Reason, 120))
		}
		fmt.Fprintf(out, "\n%d attempts, %d tokens in, %d out, $%.4f\n\n", st.Attempts, st.TokensIn, st.TokensOut, st.Cost)
	} else {
		fmt.Fprintf(out, "%s: no task state (input that never became a task)\n\n", a.ID)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SEQ\tTIME\tSTAGE\tBY\tDETAIL")
	for _, e := range a.Events {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", e.Seq, e.Time.UTC().Format("2006-01-02T15:04:05.000Z"), e.Stage, dash(e.Who), oneLine(e.Summary, 1<<10))
	}
	_ = w.Flush()
	fmt.Fprintf(out, "\n%d events; %s.\n", len(a.Events), a.Retention)
}
