// Package retention deletes Stepwise's finished history: the audit events of succeeded runs
// and of settled operations, older than a configured age, in small batches that never block
// a step. Every row that carries a promise stays, forever.
//
// It is a package function on a pool, not part of stepwise.Client: it needs no River client
// and no engine, so an operator can run it from a cron job, a maintenance command or a
// goroutine of any worker process, and it touches no code on the step path.
//
// # What is kept forever, and why
//
// Runs: every stepwise_run row and its stepwise_checkpoint. A key names one run forever:
// stepwise.Client.RunStart and schedule.StartSlot find a used key by its row and return that run, so a
// pruned key cannot be started again from cursor zero (its committed steps redone), and a
// slot's runs stay the evidence of its batch status. A failed or cancelled run can still be
// resumed from its checkpoint, so its events (why it failed) stay too, unless the operator
// names the run in Config.FailedRuns. A pruned run's row records when (history_pruned_at).
//
// Operations: every stepwise_operation row (and its requests). An operation_id must stay known
// for as long as the external system could still see a resend of it, and the ledger is what
// makes a resend carry the same id: a step replayed after a crash enqueues by (kind,
// business_key) and finds the existing row, and only the row's operation_id is the
// idempotency key the bank knows. Stepwise cannot know how long the bank keeps its keys, nor
// whether a business key could be enqueued again (a back-fill of an old date), so the row is
// the tombstone. What goes is its machine trail (op.transition events of dispatchers and the
// reconciler) once the operation is SUCCEEDED or FAILED_PERMANENT and the events are older
// than the age. An operation that is PENDING, PROCESSING, RETRYABLE, UNKNOWN_EXTERNAL or
// MANUAL keeps everything, and so does every run that wrote one: its batch is not settled.
//
// People's decisions: every console.action event, every resolution (the op.transition a person
// recorded through stepwise.Client.OperationResolve), every transition into MANUAL (what the person decided
// on), and every run.resume and run.cancel_requested (who resumed or stopped a run, and why).
// A decision about money is kept as long as the operation it decided, which is forever.
//
// Waits and signals (package workflow's WaitFor... and Signal): a succeeded run has no open
// wait (the step after a wait takes it), and a failed or cancelled run keeps its open wait and
// the signals it has not taken, even when named in FailedRuns: a resume re-enters the wait and
// takes them. The signals a pruned run took, and those sent to a succeeded run after its last
// wait (no wait can take them any more), are its history and go with its events. A signal
// not taken and sent before the age to a key that has no run goes too: a signal may come
// before its run is started, but not OlderThan before (a run started later does not see it).
//
// Schedule slots: every stepwise_schedule_slot row, one per decided slot (materialized,
// skipped with its reason, buffered). It is the record that a date was settled or why it was
// not; the tick reads only open slots, so old ones cost nothing.
//
// # Never blocking a step
//
// Each batch is its own short transaction of at most BatchSize rows, selected oldest first
// with FOR UPDATE SKIP LOCKED (a row a step holds is skipped, not waited for), under
// lock_timeout: a batch that would wait longer gives up and is tried again after a pause
// (after 100 such in one pass, the rest is left for the next pass).
// Only finished runs and settled operations are touched. Between batches Prune sleeps, so the
// step path keeps the database.
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
	// OlderThan is the age past which finished history is deleted: the events of runs that
	// succeeded before now - OlderThan, and events written before it of settled operations.
	// Required; at least MinAge.
	OlderThan time.Duration

	// FailedRuns names failed or cancelled runs whose history the operator gives up: their
	// events go whatever their age, as a succeeded run's do (people's decisions stay). A
	// failed or cancelled run can still be resumed, so Prune never touches one by age; only
	// this list does. The runs themselves (key, checkpoint) stay, and can still be resumed.
	// Prune refuses, before deleting anything, a name that is not a failed or cancelled run,
	// or a run that wrote operations not yet settled.
	FailedRuns []string

	// BatchSize is the most runs (or events) one transaction prunes; a run's events go with
	// it, so a batch of runs deletes several times as many rows. Defaults to 500; at most
	// 10000.
	BatchSize int

	// Pause is the least sleep between batches; Prune also sleeps at least three times as
	// long as the last batch took, so that it holds the database at most a quarter of the
	// time whatever the machine (measured: batches back to back with 10ms pauses slowed a
	// concurrent run's steps by 25% on 2 cores). Defaults to 10ms.
	Pause time.Duration

	// LockTimeout bounds how long a batch waits for a lock before it gives up (and is
	// tried again after a pause; after 100 such in one pass, the rest is left for the next
	// pass). Defaults to 100ms.
	LockTimeout time.Duration

	// Now is the clock. Defaults to time.Now.
	Now func() time.Time

	// Progress, when set, is called after each batch with the pass's totals so far (of
	// the batches that committed), on Prune's goroutine, before the pause that follows the
	// batch. Prune waits for it: a slow Progress slows the pass. It is for progress lines
	// (stepwise prune --apply prints one every 10 seconds); a Progress that blocks pauses
	// the pass between two batches without ending it (and must itself return once ctx
	// ends: Prune looks at ctx only after it returns). Cancelling ctx ends the pass, and the
	// next pass starts again at the oldest row (over the dead index entries of what this one
	// deleted, until VACUUM removes them).
	Progress func(Result)

	// DryRun makes Prune delete nothing: it counts what a real pass would delete now if no
	// row were locked or settled meanwhile (the
	// Result's Runs, RunEvents, OperationEvents and Signals) and what it keeps (Result.Kept), in one
	// read-only snapshot, with the very predicates the deleting batches use. Guards against
	// an operator learning what "prune" meant only after the history is gone. The counts
	// read every matching row (no batches, no pauses): run it off-peak on a large ledger.
	DryRun bool
}

// Result counts what Prune did.
type Result struct {
	// Runs is how many runs had their history pruned (their rows stay, marked); RunEvents
	// and OperationEvents how many events were deleted; Signals how many signals (see the
	// package doc, "Waits and signals").
	Runs, RunEvents, OperationEvents, Signals int64
	// Batches is how many transactions ran; Skipped how many gave up on a lock.
	Batches, Skipped int

	// DryRun is true when nothing was deleted (Config.DryRun): Runs, RunEvents,
	// OperationEvents and Signals are what a pass would delete, Kept what it keeps.
	DryRun bool
	// Kept is filled by a dry run only.
	Kept *Kept
}

// Kept counts what a dry run found Prune keeps (see the package doc for why).
type Kept struct {
	// Runs and Operations count every run and operation row: all of them stay.
	Runs, Operations int64
	// Decisions counts the events kept forever as people's decisions (console actions,
	// resolutions, moves into MANUAL, resumes, cancel requests).
	Decisions int64
	// FailedRuns counts failed or cancelled runs whose history stays because they can
	// still be resumed (not named in Config.FailedRuns).
	FailedRuns int64
	// UnsettledRuns counts succeeded runs past the age whose history stays because an
	// operation they wrote is not settled yet.
	UnsettledRuns int64
	// YoungerRuns counts succeeded runs whose history stays because they finished within
	// OlderThan.
	YoungerRuns int64
}

// Total is every row deleted or marked.
func (r *Result) Total() int64 {
	return r.Runs + r.RunEvents + r.OperationEvents + r.Signals
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

// Prune deletes the history older than cfg.OlderThan (and that of cfg.FailedRuns), batch by
// batch, until each of its walks has reached the cutoff or ctx ends (rows a walk passed
// without taking, locked by another pass or a step, or settled meanwhile, are the next
// pass's). It is safe to run from several processes at once
// (SKIP LOCKED divides the rows) and to stop at any moment (each batch commits on its own).
func Prune(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	// Guards against giving up a run the operator did not mean: every name is checked
	// before anything is deleted.
	if err := checkFailedRuns(ctx, pool, cfg.FailedRuns); err != nil {
		return nil, err
	}
	cutoff := cfg.Now().Add(-cfg.OlderThan)
	if cfg.DryRun {
		return dryRun(ctx, pool, cutoff, cfg.FailedRuns)
	}
	res := &Result{}
	var pending func() // adds the last batch's counts to res, once it committed
	// The two walks by age, the runs and the operations' events, go oldest first and carry,
	// from one batch to the next, where
	// the last committed batch ended: a batch starts there, not at the oldest row. Guards
	// against a pass that slows as it goes. The rows an earlier batch deleted (or marked)
	// stay in the walked index as dead entries until VACUUM removes them, and a batch that
	// started at the oldest row stepped over all of them: on the bench's ledger of 10M
	// operations, with 2M events deleted, 8,900 of a batch's 11,400 buffer reads and 24 of its
	// 29 ms, and the pass's rate fell from 5,000-6,300 to 2,000 rows/s over 2M events. Rows the walk
	// passed over without taking (a run locked by a step, a row locked by another pass, or
	// not prunable yet) are the next pass's.
	runPhase := func(sel func(after time.Time) runSelector) func(context.Context, pgx.Tx) (int64, error) {
		after := time.Time{} // the zero time: before every run
		return func(ctx context.Context, tx pgx.Tx) (int64, error) {
			// Counted only once the batch committed: a batch cut by ctx or a lock
			// timeout rolls back and deleted nothing.
			var runs Result
			n, last, err := pruneRuns(ctx, tx, sel(after), &runs)
			if err == nil {
				pending = func() {
					res.Runs += runs.Runs
					res.RunEvents += runs.RunEvents
					res.Signals += runs.Signals
					after = latest(after, last)
				}
			}
			return n, err
		}
	}
	var eventsAfter time.Time
	phases := []func(context.Context, pgx.Tx) (int64, error){
		runPhase(func(after time.Time) runSelector { return succeededBefore(cutoff, after, cfg.BatchSize) }),
		func(ctx context.Context, tx pgx.Tx) (int64, error) {
			n, last, err := pruneOperationEvents(ctx, tx, cutoff, eventsAfter, cfg.BatchSize)
			pending = func() {
				res.OperationEvents += n
				eventsAfter = latest(eventsAfter, last)
			}
			return n, err
		},
		func(ctx context.Context, tx pgx.Tx) (int64, error) {
			n, err := pruneOrphanSignals(ctx, tx, cutoff, cfg.BatchSize)
			pending = func() { res.Signals += n }
			return n, err
		},
	}
	if len(cfg.FailedRuns) > 0 {
		phases = append(phases, runPhase(func(time.Time) runSelector { return namedFailed(cfg.FailedRuns, cfg.BatchSize) }))
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
			if cfg.Progress != nil {
				cfg.Progress(*res)
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

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// batch runs one phase's batch in its own transaction under lock_timeout. A lock timeout is
// reported as skipped, not as an error.
func batch(ctx context.Context, pool *pgxpool.Pool, cfg *Config, phase func(context.Context, pgx.Tx) (int64, error)) (n int64, skipped bool, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// lock_timeout guards against a batch queueing behind a step's lock (and the step
		// behind the batch): give up quickly instead.
		//
		// jit off guards against a batch that spends most of its time compiling. Its
		// statements are a LIMIT over an index walk with a filter the planner cannot
		// estimate, so on a long ledger their estimated cost passes jit_above_cost (jit is
		// on by default) and each batch compiled its expressions with LLVM first: on a
		// ledger of 10M operations, 155 ms of compiling for a batch that executed in 22 ms
		// (a batch of 500: 222-265 ms with jit on, 11 ms off), so pruning went at about 650
		// rows/s. A batch reads about BatchSize rows; there is
		// nothing for JIT to win.
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true), set_config('jit', 'off', true)`,
			fmt.Sprintf("%dms", cfg.LockTimeout.Milliseconds())); err != nil {
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

// keptForever is true of an event (alias e) that records a person's decision, or what the
// person decided on; Prune never deletes one. Guards against "who marked this payout
// SUCCEEDED, and why?" having no answer once the machine trail around it is gone. Never
// NULL (to_state and detail may be), so NOT keptForever is never NULL either.
const keptForever = `coalesce(e.kind IN ('console.action', 'run.resume', 'run.cancel_requested')
	OR (e.kind = 'op.transition' AND (e.to_state = 'MANUAL' OR e.detail->>'resolution' = 'manual')), false)`

// unsettled is true of a run (alias r) that wrote an operation not yet settled: its batch is
// open, and its history is what an operator reads to settle it. Never NULL.
//
// Guards against a batch of runs reading the whole ledger. It is a scalar subquery, asked per
// run with index seeks on stepwise_operation_run_key_idx (run_key, state) for the five
// unsettled states (the other two of the table's CHECK are SUCCEEDED and FAILED_PERMANENT), so
// it costs the same for a run that wrote ten operations or a million. Written as NOT EXISTS
// (... state NOT IN settled) it was planned as an anti-join against a sequential scan of every
// operation, once per batch: at 3M operations a batch outlasted the bench's 2s windows and no
// run was ever pruned.
const unsettled = `coalesce((SELECT true FROM stepwise_operation o WHERE o.run_key = r.key
	AND o.state IN ('PENDING', 'PROCESSING', 'RETRYABLE', 'UNKNOWN_EXTERNAL', 'MANUAL') LIMIT 1), false)`

// runSelector is the query that picks (and locks) one batch of runs to prune, and its args.
// It returns each run's key and finished_at.
type runSelector struct {
	sql  string
	args []any
}

// succeededBefore picks succeeded runs finished before cutoff, and not before after, whose
// history is still there (or that finished again since it went: a named failed run resumed
// later). Failed and cancelled runs are never picked by age: they can still be resumed.
func succeededBefore(cutoff, after time.Time, limit int) runSelector {
	return runSelector{sql: `
		SELECT r.key, r.finished_at FROM stepwise_run r
		 WHERE ` + succeededBeforeWhere + `
		   AND r.finished_at >= $3
		 ORDER BY r.finished_at
		 LIMIT $2
		 FOR UPDATE OF r SKIP LOCKED`, args: []any{cutoff, limit, after}}
}

// succeededBeforeWhere selects (alias r, cutoff $1) the runs succeededBefore prunes; shared
// with the dry run so that it counts exactly what a pass deletes.
const succeededBeforeWhere = `r.status = 'succeeded' AND r.finished_at < $1
		   AND (r.history_pruned_at IS NULL OR r.history_pruned_at < r.finished_at)
		   AND NOT ` + unsettled

// namedFailedWhere selects (alias r, keys $1) the runs namedFailed prunes.
const namedFailedWhere = `r.key = ANY($1) AND r.status IN ('failed', 'cancelled')
		   AND (r.history_pruned_at IS NULL OR r.history_pruned_at < r.finished_at)
		   AND NOT ` + unsettled

// runEventsWhere selects (alias e, run keys $1) the events pruneRuns deletes. Only the run's
// own kinds: a run key may look like another subject ('op:…', 'schedule:…'), whose events
// are not the run's to delete.
const runEventsWhere = `e.subject = ANY($1) AND (e.kind LIKE 'run.%' OR e.kind LIKE 'lease.%') AND NOT ` + keptForever

// opEventsWhere selects (alias e, cutoff $1) the events pruneOperationEvents deletes; shared
// with the dry run. Each event's operation is read by its primary key (see
// operationEventsBatchSQL).
const opEventsWhere = `e.at < $1 AND e.subject LIKE 'op:%' AND e.kind = 'op.transition'
	   AND NOT ` + keptForever + `
	   AND (SELECT o.state FROM stepwise_operation o WHERE o.operation_id = ` + subjectOperationID + `)
	       IN ('SUCCEEDED', 'FAILED_PERMANENT')`

// runSignalsWhere selects (alias s, run keys $1) the signals pruneRuns deletes: those taken,
// and those of a succeeded run (no wait of it can take them). A failed or cancelled run's
// untaken signals stay: a resume re-enters its wait, which takes them. Read by the primary key
// (run_key, name, signal_id).
const runSignalsWhere = `s.run_key = ANY($1) AND (s.consumed_at IS NOT NULL
	OR (SELECT r.status FROM stepwise_run r WHERE r.key = s.run_key) = 'succeeded')`

// orphanSignalsWhere selects (alias s, cutoff $1) the signals pruneOrphanSignals deletes: not
// taken, sent before the cutoff, to a key that has no run. Walked on
// stepwise_signal_pending_idx (only the signals not taken, few however many were sent), each
// one's run read by its key.
const orphanSignalsWhere = `s.consumed_at IS NULL AND s.sent_at < $1
	AND NOT EXISTS (SELECT 1 FROM stepwise_run r WHERE r.key = s.run_key)`

// namedFailed picks the failed or cancelled runs the operator named whose history is still
// there. A run resumed since checkFailedRuns is no longer failed, and is left alone.
func namedFailed(keys []string, limit int) runSelector {
	return runSelector{sql: `
		SELECT r.key, r.finished_at FROM stepwise_run r
		 WHERE ` + namedFailedWhere + `
		 ORDER BY r.key
		 LIMIT $2
		 FOR UPDATE OF r SKIP LOCKED`, args: []any{keys, limit}}
}

// checkFailedRuns refuses a Config.FailedRuns name that is not a failed or cancelled run, or
// whose run wrote operations not yet settled, naming it and why.
func checkFailedRuns(ctx context.Context, pool *pgxpool.Pool, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	rows, err := pool.Query(ctx, `SELECT k.key, r.status, coalesce(`+unsettled+`, false)
		FROM unnest($1::text[]) k(key) LEFT JOIN stepwise_run r ON r.key = k.key`, keys)
	if err != nil {
		return fmt.Errorf("retention: reading Config.FailedRuns: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var status *string
		var open bool
		if err := rows.Scan(&key, &status, &open); err != nil {
			return fmt.Errorf("retention: reading Config.FailedRuns: %w", err)
		}
		switch {
		case status == nil:
			return fmt.Errorf("retention.Config.FailedRuns: there is no run %q; name failed or cancelled runs by their exact key", key)
		case *status != "failed" && *status != "cancelled":
			return fmt.Errorf("retention.Config.FailedRuns: run %q is %s; only a failed or cancelled run is pruned by name (a succeeded run's history goes by age)", key, *status)
		case open:
			return fmt.Errorf("retention.Config.FailedRuns: run %q wrote operations that are not settled yet; settle them (or resolve them by hand) first", key)
		}
	}
	return rows.Err()
}

// pruneRuns prunes the history of a batch of runs: deletes their run and lease events (not
// people's decisions) and marks the run rows. The run row and its checkpoint stay: they are
// what makes Start of the key return this run instead of starting it again from cursor zero.
// It returns how many runs, and the latest finished_at among them.
func pruneRuns(ctx context.Context, tx pgx.Tx, sel runSelector, res *Result) (int64, time.Time, error) {
	var (
		keys []string
		last time.Time
	)
	rows, err := tx.Query(ctx, sel.sql, sel.args...)
	if err != nil {
		return 0, last, fmt.Errorf("selecting finished runs: %w", err)
	}
	var (
		key      string
		finished *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &finished}, func() error {
		keys = append(keys, key)
		if finished != nil && finished.After(last) {
			last = *finished
		}
		return nil
	})
	if err != nil {
		return 0, last, fmt.Errorf("selecting finished runs: %w", err)
	}
	if len(keys) == 0 {
		return 0, last, nil
	}
	tag, err := tx.Exec(ctx, `DELETE FROM stepwise_event e WHERE `+runEventsWhere, keys)
	if err != nil {
		return 0, last, fmt.Errorf("deleting events of finished runs: %w", err)
	}
	res.RunEvents += tag.RowsAffected()
	tag, err = tx.Exec(ctx, `DELETE FROM stepwise_signal s WHERE `+runSignalsWhere, keys)
	if err != nil {
		return 0, last, fmt.Errorf("deleting signals of finished runs: %w", err)
	}
	res.Signals += tag.RowsAffected()
	tag, err = tx.Exec(ctx, `UPDATE stepwise_run SET history_pruned_at = now() WHERE key = ANY($1)`, keys)
	if err != nil {
		return 0, last, fmt.Errorf("marking pruned runs: %w", err)
	}
	res.Runs += tag.RowsAffected()
	return int64(len(keys)), last, nil
}

// subjectOperationID is the operation an event (alias e) is about: its subject is 'op:' and
// the operation_id, as the outbox writes it. Any other subject gives NULL, never a cast error
// that would stop every later batch.
const subjectOperationID = `(CASE WHEN e.subject ~ '^op:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
	THEN substr(e.subject, 4)::uuid END)`

// operationEventsBatchSQL selects and locks one batch of the machine transitions older than
// $1, and not older than $3, of settled operations, at most $2, oldest first.
//
// Guards against a batch whose cost grows with the ledger. The events are walked oldest first
// by stepwise_event_at_idx, and each one's operation is read by its primary key (a subplan per
// event, found from the subject), so a batch reads about $2 events and $2 operations however
// many the ledger holds. Joined on 'op:' || operation_id::text, which no index serves, each
// batch hash-joined every operation with every old event and sorted them: 0.5s a batch at
// 100,000 operations on a busy 2-core machine, minutes at 10M, and 9M old events are 18,000
// batches.
const operationEventsBatchSQL = `
	SELECT e.id FROM stepwise_event e
	 WHERE ` + opEventsWhere + `
	   AND e.at >= $3
	 ORDER BY e.at
	 LIMIT $2
	 FOR UPDATE OF e SKIP LOCKED`

// pruneOperationEvents deletes a batch of machine transitions older than cutoff of operations
// that are SUCCEEDED or FAILED_PERMANENT; the operation row and people's decisions are kept
// (see the package doc).
// It returns how many, and the latest at among them.
func pruneOperationEvents(ctx context.Context, tx pgx.Tx, cutoff, after time.Time, limit int) (int64, time.Time, error) {
	var (
		n    int64
		last *time.Time
	)
	err := tx.QueryRow(ctx, `WITH d AS (DELETE FROM stepwise_event WHERE id IN (`+operationEventsBatchSQL+`) RETURNING at)
		SELECT count(*), max(at) FROM d`, cutoff, limit, after).Scan(&n, &last)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("deleting events of settled operations: %w", err)
	}
	if last == nil {
		return n, time.Time{}, nil
	}
	return n, *last, nil
}

// pruneOrphanSignals deletes a batch of signals sent before cutoff to keys that have no run
// (orphanSignalsWhere), at most limit, skipping those a transaction holds.
func pruneOrphanSignals(ctx context.Context, tx pgx.Tx, cutoff time.Time, limit int) (int64, error) {
	tag, err := tx.Exec(ctx, `DELETE FROM stepwise_signal WHERE (run_key, name, signal_id) IN (
		SELECT s.run_key, s.name, s.signal_id FROM stepwise_signal s WHERE `+orphanSignalsWhere+`
		 ORDER BY s.sent_at LIMIT $2 FOR UPDATE OF s SKIP LOCKED)`, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("deleting signals to runs that were never started: %w", err)
	}
	return tag.RowsAffected(), nil
}

// dryRun counts what Prune would delete and keep, in one read-only REPEATABLE READ
// transaction (one snapshot: the counts add up), with the predicates the batches use.
func dryRun(ctx context.Context, pool *pgxpool.Pool, cutoff time.Time, failedRuns []string) (*Result, error) {
	res := &Result{DryRun: true, Kept: &Kept{}}
	if failedRuns == nil {
		failedRuns = []string{}
	}
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		k := res.Kept
		var orphanSignals int64
		counts := []struct {
			what string
			into *int64
			sql  string
			args []any
		}{
			{"run events to prune", &res.RunEvents, `SELECT count(*) FROM stepwise_event e WHERE ` + runEventsWhere,
				[]any{nil}}, // keys filled below
			{"signals of runs to prune", &res.Signals, `SELECT count(*) FROM stepwise_signal s WHERE ` + runSignalsWhere,
				[]any{nil}}, // keys filled below
			{"signals to no run", &orphanSignals, `SELECT count(*) FROM stepwise_signal s WHERE ` + orphanSignalsWhere, []any{cutoff}},
			{"operation events to prune", &res.OperationEvents, `SELECT count(*) FROM stepwise_event e WHERE ` + opEventsWhere, []any{cutoff}},
			{"runs", &k.Runs, `SELECT count(*) FROM stepwise_run`, nil},
			{"operations", &k.Operations, `SELECT count(*) FROM stepwise_operation`, nil},
			{"decisions", &k.Decisions, `SELECT count(*) FROM stepwise_event e WHERE ` + keptForever, nil},
			{"failed runs kept", &k.FailedRuns, `SELECT count(*) FROM stepwise_run r WHERE r.status IN ('failed', 'cancelled') AND NOT r.key = ANY($1)`,
				[]any{failedRuns}},
			{"unsettled runs kept", &k.UnsettledRuns, `SELECT count(*) FROM stepwise_run r
				WHERE r.status = 'succeeded' AND r.finished_at < $1 AND ` + unsettled, []any{cutoff}},
			{"younger runs kept", &k.YoungerRuns, `SELECT count(*) FROM stepwise_run r
				WHERE r.status = 'succeeded' AND r.finished_at >= $1`, []any{cutoff}},
		}
		// The run events counted are those of the runs a pass would prune: their keys.
		rows, err := tx.Query(ctx, `SELECT r.key FROM stepwise_run r WHERE (`+succeededBeforeWhere+`)
			OR (r.key = ANY($2) AND r.status IN ('failed', 'cancelled')
			    AND (r.history_pruned_at IS NULL OR r.history_pruned_at < r.finished_at) AND NOT `+unsettled+`)`, cutoff, failedRuns)
		if err != nil {
			return fmt.Errorf("retention dry run: selecting runs: %w", err)
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("retention dry run: selecting runs: %w", err)
		}
		res.Runs = int64(len(keys))
		counts[0].args = []any{keys}
		counts[1].args = []any{keys}
		for _, c := range counts {
			if err := tx.QueryRow(ctx, c.sql, c.args...).Scan(c.into); err != nil {
				return fmt.Errorf("retention dry run: counting %s: %w", c.what, err)
			}
		}
		res.Signals += orphanSignals
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}
