package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/core/spend"
	"github.com/dispatchmesh/dispatchmesh/services"
)

// cmdStats prints the spend figures of every task in the task store, per
// type (package spend defines them).
func cmdStats(ctx context.Context, cfg Config, args []string) error {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	typ := fs.String("type", "", "only tasks of this type")
	output := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("usage: dispatch stats [-type T] [-o text|json]")
	}
	if *typ != "" && !events.ValidType(*typ) {
		return fmt.Errorf("invalid task type %q", *typ)
	}
	js, closeFn, err := clientJS(cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	kv, err := js.KeyValue(ctx, services.BucketTasks)
	if err != nil {
		return fmt.Errorf("no task store (is the mesh provisioned?): %w", err)
	}
	var tally spend.Tally
	err = services.NewTaskStore(kv).Scan(ctx, js, func(st events.TaskState) error {
		if *typ == "" || st.Type == *typ {
			tally.Add(st)
		}
		return nil
	})
	if err != nil {
		return err
	}
	r := tally.Report()
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	return writeStats(stdout, r)
}

// writeStats prints a report as two tables: the figures per type, then the
// prompt tokens per attempt on each rung.
func writeStats(out io.Writer, r spend.Report) error {
	if len(r.Types) == 0 {
		_, err := fmt.Fprintln(out, "no tasks")
		return err
	}
	rows := r.Types
	if len(rows) > 1 {
		total := r.Total
		total.Type = "(all)"
		rows = append(slices.Clone(rows), total)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TYPE\tTASKS\tOPEN\tRESOLVED\tUNRESOLVED\tCOST\tTOKENS\tWASTED COST\tWASTED TOKENS\tCOST/RESOLVED\tTOKENS/RESOLVED\tLOOP\tRETRY OK\tREPEAT\tSAME ERROR")
	for _, f := range rows {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t$%.4f\t%d\t$%.4f\t%d\t%s\t%s\t%s\t%s\t%s\t%d\n",
			f.Type, f.Tasks, f.Open, f.Resolved, f.Unresolved, f.Cost, f.Tokens, f.WastedCost, f.WastedTokens,
			rate(f.CostPerResolved, "$%.4f"), rate(f.TokensPerResolved, "%.0f"), rate(f.LoopRate, "%.2f"),
			share(f.RetrySuccesses, f.Retries), share(f.Refused, f.Attempts), f.SameErrorRetries)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "TYPE\tRUNG\tATTEMPTS\tPROMPTED\tPROMPT TOKENS/ATTEMPT")
	for _, f := range rows {
		for _, rung := range slices.SortedFunc(maps.Keys(f.Rungs), spend.RungOrder) {
			g := f.Rungs[rung]
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", f.Type, rung, g.Attempts, g.Prompted, rate(g.PromptTokensPerAttempt, "%.0f"))
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprint(out, `
wasted: spent by tasks that ended unresolved (blocked, failed, needs_human_review, cancelled)
loop: attempts per resolved task; retry ok: attempts after a failed one that succeeded
repeat: attempts refused for repeating a failed request; same error: failures with the previous failure's reason
prompt tokens/attempt: an attempt's prompt tokens sum its model calls (a tool loop makes several)
`)
	return err
}

// rate formats a figure, "-" when it has no denominator.
func rate(v *float64, format string) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf(format, *v)
}

// share formats n of d with its percentage.
func share(n, d int) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%d %.0f%%", n, d, 100*float64(n)/float64(d))
}
