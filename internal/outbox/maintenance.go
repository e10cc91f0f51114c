package outbox

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise/internal/jitter"
)

// RunMaintenance runs the outbox's poll in this process every PollInterval (with jitter) until
// ctx ends: it settles expired leases (crash recovery), wakes the dispatcher of every kind with
// due work (RETRYABLE operations whose backoff elapsed, operations enqueued outside a River
// worker) and starts a takeover dispatcher where the kind's dispatcher stopped heartbeating
// for DispatcherLease (a kill -9). Call it in a goroutine of every worker process, beside
// workflow's Engine.RunMaintenance:
//
//	go ob.RunMaintenance(ctx, riverClient)
//
// The periodic poll Install adds runs on River's elected leader only; when the process that
// dies is the leader, retries and takeovers would otherwise wait for a new election. Polls in
// several processes at once are safe: recovery claims rows with SKIP LOCKED and wakes are
// unique inserts.
func (o *Outbox) RunMaintenance(ctx context.Context, client *river.Client[pgx.Tx]) error {
	if client == nil {
		return errors.New("outbox.RunMaintenance: client is nil; pass the River client that works the outbox's queues")
	}
	pctx := ContextWithClient(ctx, client)
	kinds := o.Kinds()
	for {
		if _, err := o.poll(pctx, kinds); err != nil && ctx.Err() == nil {
			o.config.Logger.WarnContext(ctx, "stepwise outbox: maintenance poll failed; retrying next interval", slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(jitter.Spread(o.config.PollInterval, 0.2)):
		}
	}
}

// Maintain runs the outbox's poll once, now, in this process: what RunMaintenance runs every
// PollInterval. It is for a caller that runs its own maintenance loop (stepwise.Client does)
// and counts the failures it returns.
func (o *Outbox) Maintain(ctx context.Context, client *river.Client[pgx.Tx]) error {
	if client == nil {
		return errors.New("outbox.Maintain: client is nil; pass the River client that works the outbox's queues")
	}
	_, err := o.poll(ContextWithClient(ctx, client), o.Kinds())
	return err
}
