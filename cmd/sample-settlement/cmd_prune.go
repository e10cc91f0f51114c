package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/retention"
)

func init() {
	prog.Register("prune", "delete the audit events of succeeded runs and settled operations older than --older-than (runs, operations, slots and people's decisions are kept forever)", runPrune)
}

// runPrune runs retention.Prune once: from cron, or a Kubernetes CronJob, beside the serve
// processes (its batches skip what a step holds and yield to the steps).
func runPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := prog.NewFlagSet("prune", "prune --older-than 720h [--batch-size 500] [--failed-run KEY ...]", stderr)
	var db dbFlags
	db.register(fs)
	olderThan := fs.Duration("older-than", 0, "delete the audit events of succeeded runs and settled payouts older than this, e.g. 720h for 30 days "+
		"(required; at least 24h). Every run, payout and schedule slot, and all people's decisions (who resolved, resumed or cancelled what, and why), "+
		"are kept forever")
	batchSize := fs.Int("batch-size", 500, "runs (or events) pruned per transaction; a run's events go with it")
	var failedRuns stringList
	fs.Var(&failedRuns, "failed-run", "a failed or cancelled run whose history you give up, by its exact key (repeatable); without it such runs keep everything, since they can still be resumed")
	if err := cmdline.ParseFlags(fs, args, false); err != nil {
		return err
	}
	if *olderThan == 0 {
		return cmdline.UsageError("--older-than is required: how old finished history must be to go, e.g. 720h for 30 days")
	}
	if err := cmdline.CheckDuration("older-than", *olderThan, retention.MinAge, 100*365*24*time.Hour); err != nil {
		return err
	}
	if err := cmdline.CheckInt("batch-size", *batchSize, 1, 10000); err != nil {
		return err
	}
	pool, err := db.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	start := time.Now()
	cfg := &retention.Config{OlderThan: *olderThan, BatchSize: *batchSize, FailedRuns: failedRuns}
	// A first prune of a long history runs for tens of minutes: say on stderr, every
	// pruneProgressEvery, that it is moving and how fast (stdout keeps the one result line).
	every := time.Duration(pruneProgressEvery.Load())
	next := start.Add(every)
	cfg.Progress = func(r retention.Result) {
		if now := time.Now(); !now.Before(next) {
			next = now.Add(every)
			fmt.Fprintf(stderr, "prune: %s so far: the history of %d runs, %d run events, %d operation events, %d signals (%d batches, %.0f rows/s)\n",
				now.Sub(start).Round(time.Second), r.Runs, r.RunEvents, r.OperationEvents, r.Signals, r.Batches, float64(r.Total())/now.Sub(start).Seconds())
		}
	}
	res, err := retention.Prune(ctx, pool, cfg)
	if res != nil {
		fmt.Fprintf(stdout, "pruned in %s: the history of %d runs, %d run events, %d operation events, %d signals (%d batches, %d skipped on a lock); "+
			"every run, operation and slot is kept, and every decision a person made\n",
			time.Since(start).Round(time.Millisecond), res.Runs, res.RunEvents, res.OperationEvents, res.Signals, res.Batches, res.Skipped)
	}
	return err
}

// pruneProgressEvery is how often, in ns, prune prints its progress on stderr (a test sets it
// to 0 while other tests run prune).
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
