// Package retention deletes Stepwise's finished history: terminal runs with their
// checkpoints and audit events, audit events of settled operations, and closed schedule
// slots, older than a configured age, in small batches that never block a step.
//
// It is a package function on a pool, not part of workflow.Engine: it needs no River client
// and no engine, so an operator can run it from a cron job, a maintenance command or a
// goroutine of any worker process, and it touches no code on the step path.
//
// # What is kept: operations are tombstones, forever
//
// An operation_id must stay known for as long as the external system could still see a
// resend of it, and the ledger is what makes a resend carry the same id: a step replayed
// after a crash enqueues by (kind, business_key) and finds the existing row, and only the
// row's operation_id is the idempotency key the bank knows. A bank keeps idempotency keys
// for a bounded time, but Stepwise cannot know that bound, nor whether a business key
// could be enqueued again (a back-fill of an old date). So Prune never deletes a row of
// stepwise_operation: the row is the tombstone (operation_id, kind, business_key,
// payload hash, amount, currency, final state, external reference), a few hundred bytes.
// What goes is its audit trail (stepwise_event 'op:…' rows) once the operation is
// SUCCEEDED or FAILED_PERMANENT and the events are older than the age. An operation that
// is PENDING, PROCESSING, RETRYABLE, UNKNOWN_EXTERNAL or MANUAL keeps everything, and so
// does every run that wrote one: its batch is not settled.
//
// # Never blocking a step
//
// Each batch is its own short transaction of at most BatchSize rows, selected oldest first
// with FOR UPDATE SKIP LOCKED (a row a step or a tick holds is skipped, not waited for),
// under lock_timeout: a batch that would wait longer gives up and is retried on the next
// pass. Only terminal rows are touched; running runs, their checkpoints and open slots are
// never selected. Between batches Prune sleeps Pause, so the step path keeps the database.
package retention

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MinAge is the smallest OlderThan Prune accepts: history younger than a day is what
// operators and the reconciler are still reading.
const MinAge = 24 * time.Hour

// Config configures Prune.
type Config struct {
	// OlderThan is the age past which finished history is deleted: runs finished, events
	// written and slots due before now - OlderThan. Required; at least MinAge.
	OlderThan time.Duration

	// BatchSize is the most runs (or events, or slots) one transaction deletes; a run goes
	// with its checkpoint and events, so a batch of runs deletes about five times as many
	// rows. Defaults to 500; at most 10000.
	BatchSize int

	// Pause is the least sleep between batches; Prune also sleeps at least three times as
	// long as the last batch took, so that it holds the database at most a quarter of the
	// time whatever the machine (measured: batches back to back with 10ms pauses slowed a
	// concurrent run's steps by 25% on 2 cores). Defaults to 10ms.
	Pause time.Duration

	// LockTimeout bounds how long a batch waits for a lock before it gives up (and the
	// rows are left for the next pass). Defaults to 100ms.
	LockTimeout time.Duration

	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Result counts what Prune deleted.
type Result struct {
	Runs, Checkpoints, RunEvents, OperationEvents, Slots int64
	// Batches is how many transactions ran; Skipped how many gave up on a lock.
	Batches, Skipped int
}

// Total is every row deleted.
func (r *Result) Total() int64 {
	return r.Runs + r.Checkpoints + r.RunEvents + r.OperationEvents + r.Slots
}

func (c *Config) withDefaults() (*Config, error) {
	if c == nil {
		return nil, errors.New("retention.Prune: config is nil; set Config.OlderThan (at least 24h)")
	}
	out := *c
	if out.BatchSize == 0 {
		out.BatchSize = 500
	}
	if out.Pause == 0 {
		out.Pause = 10 * time.Millisecond
	}
	if out.LockTimeout == 0 {
		out.LockTimeout = 100 * time.Millisecond
	}
	if out.Now == nil {
		out.Now = time.Now
	}
	switch {
	case out.OlderThan < MinAge:
		return nil, fmt.Errorf("retention.Config.OlderThan is %s; want at least %s (history younger than a day is still read)", out.OlderThan, MinAge)
	case out.BatchSize < 1 || out.BatchSize > 10000:
		return nil, fmt.Errorf("retention.Config.BatchSize is %d; want 1 to 10000 (a bigger batch holds its locks longer)", out.BatchSize)
	case out.Pause < 0:
		return nil, fmt.Errorf("retention.Config.Pause is %s; want 0 or more", out.Pause)
	case out.LockTimeout < time.Millisecond:
		return nil, fmt.Errorf("retention.Config.LockTimeout is %s; want at least 1ms", out.LockTimeout)
	}
	return &out, nil
}

// Prune deletes the history older than cfg.OlderThan, batch by batch, until none is left or
// ctx ends. It is safe to run from several processes at once (SKIP LOCKED divides the rows)
// and to stop at any moment (each batch commits on its own).
func Prune(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cutoff := cfg.Now().Add(-cfg.OlderThan)
	res := &Result{}
	var pending func() // adds the last batch's counts to res, once it committed
	phases := []func(context.Context, pgx.Tx) (int64, error){
		func(ctx context.Context, tx pgx.Tx) (int64, error) {
			// Counted only once the batch committed: a batch cut by ctx or a lock
			// timeout rolls back and deleted nothing.
			var runs Result
			n, err := pruneRuns(ctx, tx, cutoff, cfg.BatchSize, &runs)
			if err == nil {
				pending = func() {
					res.Runs += runs.Runs
					res.RunEvents += runs.RunEvents
					res.Checkpoints += runs.Checkpoints
				}
			}
			return n, err
		},
		func(ctx context.Context, tx pgx.Tx) (int64, error) {
			n, err := pruneOperationEvents(ctx, tx, cutoff, cfg.BatchSize)
			pending = func() { res.OperationEvents += n }
			return n, err
		},
		func(ctx context.Context, tx pgx.Tx) (int64, error) {
			n, err := pruneSlots(ctx, tx, cutoff, cfg.BatchSize)
			pending = func() { res.Slots += n }
			return n, err
		},
	}
	for _, phase := range phases {
		for {
			batchStart := time.Now()
			pending = nil
			n, skipped, err := batch(ctx, pool, cfg, phase)
			took := time.Since(batchStart)
			if err != nil {
				return res, err
			}
			if !skipped && pending != nil {
				pending()
			}
			res.Batches++
			if skipped {
				res.Skipped++
			}
			if !skipped && n < int64(cfg.BatchSize) {
				break // this phase is done
			}
			if skipped && res.Skipped > 100 {
				return res, nil // contended: leave the rest for the next pass
			}
			// Guards against pruning crowding out the steps: yield three times the
			// batch's time, so that pruning holds the database a quarter of the time.
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(max(cfg.Pause, 3*took)):
			}
		}
	}
	return res, nil
}

// batch runs one phase's batch in its own transaction under lock_timeout. A lock timeout is
// reported as skipped, not as an error.
func batch(ctx context.Context, pool *pgxpool.Pool, cfg *Config, phase func(context.Context, pgx.Tx) (int64, error)) (n int64, skipped bool, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Guards against a batch queueing behind a step's lock (and the step behind the
		// batch): give up quickly instead.
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = '%dms'", cfg.LockTimeout.Milliseconds())); err != nil {
			return err
		}
		n, err = phase(ctx, tx)
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		return 0, true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("retention: %w", err)
	}
	return n, false, nil
}

// pruneRuns deletes a batch of runs finished before cutoff, with their audit events and
// checkpoints. A run that wrote an operation not yet settled is kept: its batch is open.
func pruneRuns(ctx context.Context, tx pgx.Tx, cutoff time.Time, limit int, res *Result) (int64, error) {
	rows, err := tx.Query(ctx, `
		SELECT r.key FROM stepwise_run r
		 WHERE r.status IN ('succeeded', 'failed', 'cancelled') AND r.finished_at < $1
		   AND NOT EXISTS (SELECT FROM stepwise_operation o WHERE o.run_key = r.key
		                    AND o.state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT'))
		 ORDER BY r.finished_at
		 LIMIT $2
		 FOR UPDATE OF r SKIP LOCKED`, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("selecting finished runs: %w", err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("selecting finished runs: %w", err)
	}
	if len(keys) == 0 {
		return 0, nil
	}
	tag, err := tx.Exec(ctx, `DELETE FROM stepwise_event WHERE subject = ANY($1)`, keys)
	if err != nil {
		return 0, fmt.Errorf("deleting events of finished runs: %w", err)
	}
	res.RunEvents += tag.RowsAffected()
	tag, err = tx.Exec(ctx, `DELETE FROM stepwise_run WHERE key = ANY($1)`, keys)
	if err != nil {
		return 0, fmt.Errorf("deleting finished runs: %w", err)
	}
	res.Runs += tag.RowsAffected()
	// The checkpoint goes with its run: nothing claims a finished run's lease again.
	tag, err = tx.Exec(ctx, `DELETE FROM stepwise_checkpoint WHERE key = ANY($1)`, keys)
	if err != nil {
		return 0, fmt.Errorf("deleting checkpoints of finished runs: %w", err)
	}
	res.Checkpoints += tag.RowsAffected()
	return int64(len(keys)), nil
}

// pruneOperationEvents deletes a batch of audit events older than cutoff of operations that
// are SUCCEEDED or FAILED_PERMANENT; the operation row itself is kept (see the package doc).
func pruneOperationEvents(ctx context.Context, tx pgx.Tx, cutoff time.Time, limit int) (int64, error) {
	tag, err := tx.Exec(ctx, `
		DELETE FROM stepwise_event WHERE id IN (
			SELECT e.id FROM stepwise_event e
			  JOIN stepwise_operation o ON e.subject = 'op:' || o.operation_id::text
			 WHERE e.at < $1 AND e.subject LIKE 'op:%'
			   AND o.state IN ('SUCCEEDED', 'FAILED_PERMANENT')
			 ORDER BY e.at
			 LIMIT $2
			 FOR UPDATE OF e SKIP LOCKED)`, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("deleting events of settled operations: %w", err)
	}
	return tag.RowsAffected(), nil
}

// pruneSlots deletes a batch of closed schedule slots due before cutoff: skipped ones, and
// materialized ones whose runs all finished. The newest slot of each schedule is kept.
func pruneSlots(ctx context.Context, tx pgx.Tx, cutoff time.Time, limit int) (int64, error) {
	tag, err := tx.Exec(ctx, `
		DELETE FROM stepwise_schedule_slot WHERE (schedule, slot) IN (
			SELECT s.schedule, s.slot FROM stepwise_schedule_slot s
			 WHERE s.slot < $1
			   AND (s.status = 'skipped' OR (s.status = 'materialized' AND s.runs_done_at IS NOT NULL))
			   AND s.slot < (SELECT max(l.slot) FROM stepwise_schedule_slot l WHERE l.schedule = s.schedule)
			 ORDER BY s.slot
			 LIMIT $2
			 FOR UPDATE OF s SKIP LOCKED)`, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("deleting closed schedule slots: %w", err)
	}
	return tag.RowsAffected(), nil
}
