package reconcile

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise/internal/jitter"
	"github.com/stepwise-go/stepwise/internal/outbox"
)

// RunMaintenance runs a reconciliation pass in this process every Interval (with jitter) until
// ctx ends. Call it in a goroutine of every worker process, beside the outbox's and workflow's
// RunMaintenance:
//
//	go rec.RunMaintenance(ctx, riverClient)
//
// The periodic pass Install adds runs on River's elected leader only, so a frozen or dead
// leader would hold reconciliation until a new election. Passes in several processes at once
// are safe (see Overlapping passes in the package documentation). The client wakes the
// dispatcher of an operation sent back to RETRYABLE.
func (r *Reconciler) RunMaintenance(ctx context.Context, client *river.Client[pgx.Tx]) error {
	if client == nil {
		return errors.New("reconcile.RunMaintenance: client is nil; pass the River client that works the outbox's queues")
	}
	pctx := outbox.ContextWithClient(ctx, client)
	for {
		_, err := r.run(pctx, &RunOpts{}, time.Now().Add(r.config.Slice))
		if errors.Is(err, errSliceOver) && ctx.Err() == nil {
			continue // more is due: go on at once
		}
		if err != nil && ctx.Err() == nil {
			r.config.Logger.WarnContext(ctx, "stepwise reconcile: maintenance pass failed; retrying next interval", slog.String("error", err.Error()))
		}
		wait := r.config.Interval + jitter.UpTo(r.config.Interval/5+1)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// Maintain runs reconciliation passes now, in this process, a Slice at a time, until nothing
// is due: what RunMaintenance runs every Interval. It is for a caller that runs its own
// maintenance loop (stepwise.Client does) and counts the failures it returns. The client
// wakes the dispatcher of an operation sent back to RETRYABLE.
func (r *Reconciler) Maintain(ctx context.Context, client *river.Client[pgx.Tx]) (*PassResult, error) {
	if client == nil {
		return nil, errors.New("reconcile.Maintain: client is nil; pass the River client that works the outbox's queues")
	}
	pctx := outbox.ContextWithClient(ctx, client)
	total := newPassResult()
	for {
		res, err := r.run(pctx, &RunOpts{}, time.Now().Add(r.config.Slice))
		if res != nil {
			total.add(res)
		}
		if errors.Is(err, errSliceOver) && ctx.Err() == nil {
			continue // more is due: go on at once
		}
		return total, err
	}
}
