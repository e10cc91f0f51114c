package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/stepwise-go/stepwise/retention"
)

func runPrune(ctx context.Context, c *cli, args []string) error {
	f := c.newFlags("--older-than 720h [--failed-run KEY ...] [--batch-size 500] [--apply] [--json]", true, true)
	olderThan := f.Duration("older-than", 0, "prune the history of succeeded runs and settled operations older than this, e.g. 720h for 30 days (required; at least 24h)")
	var failed stringList
	f.Var(&failed, "failed-run", "a failed or cancelled run whose history you give up, by its exact key (repeatable); without it such runs keep everything, since they can still be resumed")
	batch := f.Int("batch-size", 500, "with --apply: runs (or events) per transaction (1 to 10000)")
	apply := f.Bool("apply", false, "delete; without it prune is a dry run that deletes nothing and says what it would delete and keep")
	if _, err := f.parse(args, 0, 0, ""); err != nil {
		return err
	}
	switch {
	case *olderThan == 0:
		return usageError("%s: --older-than is required: how old finished history must be to go, e.g. 720h for 30 days", c.path)
	case *olderThan < retention.MinAge || *olderThan > 100*365*24*time.Hour:
		return usageError("%s: --older-than %s: want %s to 876000h (history younger than a day is still read)", c.path, *olderThan, retention.MinAge)
	case *batch < 1 || *batch > 10000:
		return usageError("%s: --batch-size %d: want 1 to 10000", c.path, *batch)
	}
	pool, _, err := f.open(ctx, false)
	if err != nil {
		return err
	}
	defer pool.Close()
	start := time.Now()
	cfg := &retention.Config{OlderThan: *olderThan, FailedRuns: failed, BatchSize: *batch, DryRun: !*apply}
	if *apply {
		// A first prune of a long history runs for tens of minutes (9M events at 5,000-10,000
		// rows/s on the bench's 2-core machine): say on stderr that it is moving, and how fast.
		every := time.Duration(pruneProgressEvery.Load())
		next := start.Add(every)
		cfg.Progress = func(r retention.Result) {
			if now := time.Now(); !now.Before(next) {
				next = now.Add(every)
				fmt.Fprintf(c.stderr, "prune: %s so far: the history of %d runs, %d run events, %d operation events, %d signals (%d batches, %.0f rows/s)\n",
					now.Sub(start).Round(time.Second), r.Runs, r.RunEvents, r.OperationEvents, r.Signals, r.Batches, float64(r.Total())/now.Sub(start).Seconds())
			}
		}
	}
	res, err := retention.Prune(ctx, pool, cfg)
	if res == nil {
		// The SDK names its own field; here it is a flag.
		if err != nil && strings.Contains(err.Error(), "retention.Config.FailedRuns") {
			return errors.New(strings.ReplaceAll(err.Error(), "retention.Config.FailedRuns", "--failed-run"))
		}
		return err
	}
	if f.json {
		if jerr := c.printJSON(map[string]any{"dry_run": res.DryRun, "older_than": olderThan.String(), "runs": res.Runs, "run_events": res.RunEvents,
			"operation_events": res.OperationEvents, "signals": res.Signals, "batches": res.Batches, "skipped_on_lock": res.Skipped, "kept": res.Kept}); jerr != nil {
			return jerr
		}
		return err
	}
	if res.DryRun {
		k := res.Kept
		fmt.Fprintf(c.stdout, "dry run (nothing deleted) of history older than %s:\n", *olderThan)
		fmt.Fprintf(c.stdout, "  would delete: the event history of %d runs (%d run events) %d events of settled operations and %d signals\n", res.Runs, res.RunEvents, res.OperationEvents, res.Signals)
		fmt.Fprintf(c.stdout, "  would keep:   every run (%d) and operation (%d) row, every schedule slot, and %d people's decisions (resolutions, resumes, cancels, console actions), forever;\n",
			k.Runs, k.Operations, k.Decisions)
		fmt.Fprintf(c.stdout, "                the whole history of %d failed or cancelled runs (resumable; name one with --failed-run to give it up), %d runs whose operations are not settled, %d runs younger than %s\n",
			k.FailedRuns, k.UnsettledRuns, k.YoungerRuns, *olderThan)
		fmt.Fprintf(c.stdout, "run again with --apply to delete\n")
		return err
	}
	fmt.Fprintf(c.stdout, "pruned in %s: the history of %d runs, %d run events, %d operation events, %d signals (%d batches, %d skipped on a lock: run again later for those); "+
		"every run, operation and slot is kept, and every decision a person made\n",
		time.Since(start).Round(time.Millisecond), res.Runs, res.RunEvents, res.OperationEvents, res.Signals, res.Batches, res.Skipped)
	return err
}

// pruneProgressEvery is how often, in ns, prune --apply prints its progress on stderr (a
// test sets it to 0 while other tests run prune).
var pruneProgressEvery atomic.Int64

func init() { pruneProgressEvery.Store(int64(10 * time.Second)) }

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	if v == "" {
		return errors.New("empty: name a run by its exact key")
	}
	*l = append(*l, v)
	return nil
}
