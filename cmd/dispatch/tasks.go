package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
)

const tasksUsage = `usage: dispatch tasks [-type T] [-status S] [-subject TEXT] [-id ID] [-since TIME|DURATION] [-until TIME|DURATION]
                      [-limit N] [-cursor C] [-o json]          (alias: dispatch ls)
  every task, newest first; TIME is RFC 3339 (2026-05-18T14:22:00Z) or a date, DURATION (24h) means that long ago;
  a page ends with the command that prints the next (older) one`

func cmdTasks(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("tasks", flag.ContinueOnError)
	var q review.TaskQuery
	var since, until, status string
	fs.StringVar(&q.Type, "type", "", "only this task type")
	fs.StringVar(&status, "status", "", "only this status: "+review.JoinStatuses(review.Statuses))
	fs.StringVar(&q.Subject, "subject", "", "only this subject (exact)")
	fs.StringVar(&q.ID, "id", "", "find one task by its id")
	fs.StringVar(&since, "since", "", "only tasks queued at or after this time (or this long ago: 24h)")
	fs.StringVar(&until, "until", "", "only tasks queued before this time (or this long ago)")
	fs.IntVar(&q.Limit, "limit", review.DefaultPageSize, fmt.Sprintf("tasks per page (at most %d)", review.MaxPageSize))
	fs.StringVar(&q.Cursor, "cursor", "", "continue after the previous page (its cursor)")
	output := outputFlag(fs)
	if pos, err := parseArgs(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("tasks takes no arguments, got %q\n%s", pos, tasksUsage)
	}
	q.Status = events.Status(status)
	var err error
	now := time.Now()
	if q.Since, err = whenFlag("since", since, now); err != nil {
		return err
	}
	if q.Until, err = whenFlag("until", until, now); err != nil {
		return err
	}
	rc, closeFn, err := listClient(cfg) // listing needs no policy: the client user may list
	if err != nil {
		return err
	}
	defer closeFn()
	p, err := rc.Tasks(ctx, q)
	if err != nil {
		return err
	}
	if *output == "json" {
		return writeJSON(stdout, p)
	}
	printTasks(stdout, p, args)
	return nil
}

// whenFlag reads a time: RFC 3339, a date (UTC), or a duration ago.
func whenFlag(name, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("-%s %q: not a time (2026-05-18T14:22:00Z, 2026-05-18) or a duration (24h)", name, s)
}

func printTasks(out io.Writer, p review.TaskPage, args []string) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "QUEUED\tTASK\tTYPE\tSTATUS\tATTEMPTS\tCOST\tSUBJECT")
	for _, r := range p.Tasks {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t$%.4f\t%s\n", r.SubmittedAt.Local().Format("2006-01-02 15:04:05"), r.ID, r.Type,
			dash(string(r.Status)), r.Attempts, r.Cost, oneLine(r.Subject, 60))
	}
	_ = w.Flush()
	if len(p.Tasks) == 0 {
		fmt.Fprintln(out, "(no task matches)")
	}
	if p.Partial {
		read := "index entries"
		if p.Via == review.ViaRecords {
			read = "records"
		}
		fmt.Fprintf(out, "\n(this page stopped early, after reading %d %s: filtered by status, a page reads at most %d per task it can show; older tasks of that status may remain)\n",
			p.Scanned, read, review.StatusScanFactor)
	}
	if p.Next == "" {
		return
	}
	fmt.Fprintf(out, "\nolder: %s\n", nextCommand("dispatch tasks", args, p.Next))
}

func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"\\$`*?[]{}()<>|&;#~!") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

const cancelUsage = `usage: dispatch cancel ID [-note TEXT] [-by WHO]
  stops a pending or running task: status cancelled, a running model call is abandoned`

func cmdCancel(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("cancel", flag.ContinueOnError)
	note := fs.String("note", "", "why (optional)")
	by := fs.String("by", review.DefaultBy(), "who acts")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New(cancelUsage)
	}
	rc, closeFn, err := reviewClient(cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	d, err := rc.Cancel(ctx, pos[0], *note, *by)
	if err != nil {
		return err
	}
	if d.Already {
		fmt.Fprintf(stdout, "%s: already cancelled (%s)\n", pos[0], oneLine(d.Task.Reason, 1<<10))
		return nil
	}
	fmt.Fprintf(stdout, "%s: cancelled by %s\n", pos[0], d.Action.By)
	return nil
}
