package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/stepwise-go/stepwise/retention"
)

func init() {
	register("prune", "delete finished runs, their checkpoints and events, and closed slots older than --older-than (operations are kept)", runPrune)
}

// runPrune runs retention.Prune once: from cron, or a Kubernetes CronJob, beside the serve
// processes (its batches skip what a step holds and yield to the steps).
func runPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("prune", "prune --older-than 720h [--batch-size 500]", stderr)
	var db dbFlags
	db.register(fs)
	olderThan := fs.Duration("older-than", 0, "delete finished history older than this, e.g. 720h for 30 days (required; at least 24h)")
	batchSize := fs.Int("batch-size", 500, "finished runs (or events, or slots) deleted per transaction; a run takes its checkpoint and events with it")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if *olderThan == 0 {
		return usageError("--older-than is required: how old finished history must be to go, e.g. 720h for 30 days")
	}
	if err := checkDuration("older-than", *olderThan, retention.MinAge, 100*365*24*time.Hour); err != nil {
		return err
	}
	if err := checkInt("batch-size", *batchSize, 1, 10000); err != nil {
		return err
	}
	pool, err := db.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	start := time.Now()
	res, err := retention.Prune(ctx, pool, &retention.Config{OlderThan: *olderThan, BatchSize: *batchSize})
	if res != nil {
		fmt.Fprintf(stdout, "pruned in %s: %d runs, %d checkpoints, %d run events, %d operation events, %d schedule slots (%d batches, %d skipped on a lock); operations are kept\n",
			time.Since(start).Round(time.Millisecond), res.Runs, res.Checkpoints, res.RunEvents, res.OperationEvents, res.Slots, res.Batches, res.Skipped)
	}
	return err
}
