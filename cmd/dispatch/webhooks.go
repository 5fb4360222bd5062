package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/dispatchmesh/dispatchmesh/services/webhook"
)

// cmdWebhooks lists the failing webhook deliveries — retrying, or given up
// and not delivered since — or redelivers some or all of those given up.
func cmdWebhooks(ctx context.Context, cfg Config, args []string) error {
	redeliver := len(args) > 0 && args[0] == "redeliver"
	if redeliver {
		args = args[1:]
	}
	fs := flag.NewFlagSet("webhooks", flag.ContinueOnError)
	output := outputFlag(fs)
	all := fs.Bool("all", false, "redeliver every delivery listed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ids := fs.Args()
	switch {
	case !redeliver && (len(ids) > 0 || *all):
		return errors.New("usage: dispatch webhooks [-o json] | dispatch webhooks redeliver ID...|-all")
	case redeliver && len(ids) == 0 && !*all:
		return errors.New("usage: dispatch webhooks redeliver ID... (a task id or a delivery id) or -all")
	}
	js, closeFn, err := clientJS(cfg)
	if err != nil {
		return err
	}
	defer closeFn()
	failing, err := webhook.ListFailing(ctx, js)
	if err != nil {
		return err
	}
	if !redeliver {
		if *output == "json" {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(failing)
		}
		return writeFailing(stdout, failing)
	}
	picked, missing := pickFailing(failing, ids, *all)
	for _, f := range picked {
		if err := webhook.Redeliver(ctx, js, f); err != nil {
			return fmt.Errorf("redeliver %s: %w", f.Due.DeliveryID, err)
		}
		fmt.Fprintf(stdout, "redelivering %s (task %s) to %s\n", f.Due.DeliveryID, f.Due.TaskID, f.Due.URL)
	}
	if len(missing) > 0 {
		return fmt.Errorf("no delivery given up for %v (dispatch webhooks lists them; a retrying one is still being tried)", missing)
	}
	return nil
}

// pickFailing is the deliveries given up among failing that ids name (a
// task id or a delivery id), or all of them, and the ids that name none
// (a retrying delivery is still being tried: it cannot be redelivered).
func pickFailing(failing []webhook.Failing, ids []string, all bool) (picked []webhook.Failing, missing []string) {
	failing = slices.DeleteFunc(slices.Clone(failing), func(f webhook.Failing) bool { return f.State != webhook.StateGivenUp })
	for _, id := range ids {
		if !slices.ContainsFunc(failing, func(f webhook.Failing) bool { return f.Due.TaskID == id || f.Due.DeliveryID == id }) {
			missing = append(missing, id)
		}
	}
	for _, f := range failing {
		if all || slices.Contains(ids, f.Due.TaskID) || slices.Contains(ids, f.Due.DeliveryID) {
			picked = append(picked, f)
		}
	}
	return picked, missing
}

func writeFailing(w io.Writer, failing []webhook.Failing) error {
	if len(failing) == 0 {
		_, err := fmt.Fprintln(w, "no webhook delivery is failing")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DELIVERY\tTASK\tSTATE\tTRIES\tLAST TRY\tNEXT TRY\tURL\tLAST ERROR")
	for _, f := range failing {
		next := "-" // given up: dispatch webhooks redeliver
		if !f.NextAt.IsZero() {
			next = f.NextAt.Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", f.Due.DeliveryID, f.Due.TaskID, f.State, f.Attempts,
			f.At.Format(time.DateTime), next, f.Due.URL, f.LastError)
	}
	return tw.Flush()
}
