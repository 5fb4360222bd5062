// Command dispatch runs the dispatchmesh services and talks to a running mesh.
//
//	dispatch up                          embedded NATS + every service, one process
//	dispatch intake|verifier|gate|prompt|executor|recorder
//	                                     one service against NATS_URL
//	dispatch submit -type T -subject S [-payload JSON] [-id ID] [-wait [-progress 5s]]
//	dispatch status [-v] ID [-o json]
//	dispatch tasks|ls [-type T] [-status S] [-subject S] [-id ID] [-since T] [-until T] [-cursor C] [-o json]
//	dispatch cancel ID [-note TEXT]
//	dispatch review list|show|resolve|reject|requeue …
//	dispatch audit ID [-o json]
//	dispatch policy set [-rev N] FILE | get [-rev N] | validate FILE
//	dispatch stats [-type T] [-o json]
//	dispatch web [-listen ADDR]
//	dispatch schema [NAME]
//	dispatch bench spend [-tasks N] [-mode once|steady|both] [-runs N] [-o json]
//
// Configuration comes from DISPATCH_* environment variables (see README).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const usage = `dispatch — supervised dispatch of tasks to LLM agents over NATS JetStream

Usage:
  dispatch up                         start an embedded NATS server and every service
  dispatch provision                  create or update the stream and buckets (as an admin user)
  dispatch intake|verifier|gate|prompt|executor|recorder|reaper|webhook
                                      run one service against NATS_URL (webhook: DISPATCH_WEBHOOK_*)
  dispatch webhooks [-o json]         failing webhook deliveries: retrying, or given up and not delivered since
  dispatch webhooks redeliver ID...|-all
                                      try them again (ID: a task id or a delivery id)
  dispatch submit -type T -subject S [-payload JSON] [-id ID] [-max-retries N] [-wait [-progress 5s] [-timeout 10m]]
  dispatch status [-v] ID [-o json]   a task's current state; -v: its payload and every attempt's answer
  dispatch tasks [-type T] [-status S] [-subject TEXT] [-id ID] [-since T] [-until T] [-limit N] [-cursor C] [-o json]
                                      every task, newest first, a page at a time (alias: ls)
  dispatch cancel ID [-note TEXT] [-by WHO]
                                      stop a pending or running task: it ends cancelled
  dispatch review list [-reason R] [-type T] [-age 24h] [-all] [-answered] [-o json]
                                      what is waiting for a human, counts per reason
  dispatch review show ID [-o json]   why a task stopped: trust, attempts, dead ends, records
  dispatch review resolve|reject|requeue ID -note TEXT [-by WHO]
                                      decide; a requeue's note reaches the next prompt
  dispatch review resolve|reject|requeue [ID[@N]...] [-type T] [-reason R] -note TEXT
                                      bulk: the IDs, then every open item of a type and/or reason, one
                                      note, reported per item; ID@N only if it still holds the N
                                      decisions you saw (another reviewer's decision stands)
  dispatch audit ID [-o json]         a task's whole timeline from the stream, who did what
  dispatch stats [-type T] [-o json]  spend per type: wasted, retry success, loop rate, cost per resolved task
  dispatch web [-listen ADDR]         the review page and JSON API (DISPATCH_HTTP_LISTEN)
  dispatch rebuild [-apply] [-policy FILE]
                                      recompute the KV stores from the stream (each event with the policy
                                      revision it names), report differences
  dispatch whatif -policy FILE|-shadow [-since 24h] [-type T] [-o json]
                                      re-decide the recorded history under FILE: cost, fates, changed tasks
  dispatch policy set [-rev N] FILE   make FILE (validated, templates inlined) the policy of every service
                                      (-rev: only if revision N is in force)
  dispatch policy get [-rev N]        print the policy in the bucket dispatch_policy
  dispatch policy validate FILE       check a policy file without connecting
  dispatch policy shadow FILE|-clear  compute every decision under FILE too, never enforced; promote makes it live
  dispatch schema [NAME]              print the embedded JSON Schemas
  dispatch bench spend [-tasks N] [-mode once|steady|both] [-runs N] [-o json]
                                      what a mixed workload costs through the mesh vs a naive retry loop

Configuration: DISPATCH_* environment variables (see README.md).
`

// exitError carries a process exit code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dispatch:", err)
		var ee *exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Print(usage)
		return nil
	}
	cmd, rest := args[0], args[1:]
	if cmd == "schema" {
		return cmdSchema(rest)
	}
	if cmd == "bench" {
		return cmdBench(ctx, rest)
	}
	cfg, err := loadConfig()
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	switch cmd {
	case "up":
		return cmdUp(ctx, cfg, rest)
	case "intake", "verifier", "gate", "prompt", "executor", "recorder", "reaper", "webhook":
		return cmdService(ctx, cfg, cmd, rest)
	case "provision":
		return cmdProvision(ctx, cfg, rest)
	case "submit":
		return cmdSubmit(ctx, cfg, rest)
	case "status":
		return cmdStatus(ctx, cfg, rest)
	case "tasks", "ls":
		return cmdTasks(ctx, cfg, rest)
	case "cancel":
		return cmdCancel(ctx, cfg, rest)
	case "review":
		return cmdReview(ctx, cfg, rest)
	case "audit":
		return cmdAudit(ctx, cfg, rest)
	case "webhooks":
		return cmdWebhooks(ctx, cfg, rest)
	case "stats":
		return cmdStats(ctx, cfg, rest)
	case "web":
		return cmdWeb(ctx, cfg, rest)
	case "rebuild":
		return cmdRebuild(ctx, cfg, rest)
	case "whatif":
		return cmdWhatIf(ctx, cfg, rest)
	case "policy":
		return cmdPolicy(ctx, cfg, rest)
	}
	return fmt.Errorf("unknown command %q\n\n%s", cmd, usage)
}
