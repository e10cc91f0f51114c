package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
)

// MaintenanceArgs are the args of Stepwise's leader-run maintenance job.
type MaintenanceArgs struct{}

// Kind is the River job kind of the maintenance job.
func (MaintenanceArgs) Kind() string { return "stepwise_maintenance" }

type maintenanceWorker struct {
	river.WorkerDefaults[MaintenanceArgs]
	e *Engine
}

func (w *maintenanceWorker) Work(ctx context.Context, job *river.Job[MaintenanceArgs]) error {
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return err
	}
	_, err = w.e.Maintain(ctx, client)
	return err
}

// MaintenanceResult says what one maintenance pass did.
type MaintenanceResult struct {
	// TakenOver are runs whose worker vanished and that were re-enqueued under a new job.
	TakenOver []string
	// Failed are runs ended as failed because their attempts are used up or their River job
	// ended without finishing them.
	Failed []string
}

// rawArgs re-inserts a run's original args, byte for byte, under a new job.
type rawArgs struct {
	kind string
	raw  json.RawMessage
}

func (r rawArgs) Kind() string                 { return r.kind }
func (r rawArgs) MarshalJSON() ([]byte, error) { return r.raw, nil }

// Maintain runs one maintenance pass (protocol step 5, fast takeover). A worker killed by
// kill -9 leaves its run's lease to expire and its River job 'running'; River would rescue
// that job only after RescueStuckJobsAfter (an hour by default, never with a timeout of -1).
// Maintain finds such runs and re-enqueues each under a new job, which claims the run from its
// last committed cursor: takeover after about Lease + MaintenanceInterval. The run's
// river_job_id moves to the new job in the same transaction, compare-and-set on the old id, so
// two overlapping passes re-enqueue a run once; when River finally rescues the old job, it
// finds itself superseded and exits. River periodic jobs run on the leader only; Maintain is
// also safe to call by hand.
func (e *Engine) Maintain(ctx context.Context, client *river.Client[pgx.Tx]) (*MaintenanceResult, error) {
	if client == nil {
		return nil, errors.New("workflow.Maintain: client is nil")
	}
	type stuck struct {
		key         string
		jobID       *int64
		jobState    *string
		attempts    int
		kind        string
		input       json.RawMessage
		queue       *string
		priority    *int
		maxAttempts *int
	}
	// A run is stuck when it is unfinished and its job is running with no live lease (the
	// worker died after River fetched the job, before or after claiming), or its job has
	// ended or vanished without finishing it.
	rows, err := e.pool.Query(ctx, `
		SELECT r.key, r.river_job_id, j.state::text, r.attempts, r.workflow, r.input, j.queue, j.priority, j.max_attempts
		  FROM stepwise_run r
		  JOIN stepwise_checkpoint c ON c.key = r.key
		  LEFT JOIN river_job j ON j.id = r.river_job_id
		 WHERE r.status IN ('pending', 'running')
		   AND (c.lease_until IS NULL OR c.lease_until < now())
		   AND (
		        (j.state = 'running' AND j.attempted_at < now() - $1 * interval '1 millisecond')
		     OR j.id IS NULL
		     OR j.state IN ('completed', 'discarded', 'cancelled')
		   )
		 ORDER BY r.updated_at
		 LIMIT 100`, e.cfg.Lease.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("finding stuck runs: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (stuck, error) {
		var s stuck
		err := row.Scan(&s.key, &s.jobID, &s.jobState, &s.attempts, &s.kind, &s.input, &s.queue, &s.priority, &s.maxAttempts)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("finding stuck runs: %w", err)
	}

	res := &MaintenanceResult{}
	for _, s := range list {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			maxAttempts := river.MaxAttemptsDefault
			if s.maxAttempts != nil {
				maxAttempts = *s.maxAttempts
			}
			// A run whose job River discarded or cancelled, or that has crashed as many
			// times as its job may be attempted, ends failed and visible: re-enqueueing a
			// crash loop forever would hide it.
			reason := ""
			switch {
			case s.jobState != nil && (*s.jobState == "discarded" || *s.jobState == "cancelled"):
				reason = fmt.Sprintf("its River job %d ended %s without finishing the run", *s.jobID, *s.jobState)
			case s.attempts >= maxAttempts:
				reason = fmt.Sprintf("its worker vanished on attempt %d of %d (crash or lost lease each time)", s.attempts, maxAttempts)
			}
			if reason != "" {
				tag, err := tx.Exec(ctx, `UPDATE stepwise_run SET status = 'failed', last_error = $3, finished_at = now(), updated_at = now()
					WHERE key = $1 AND river_job_id IS NOT DISTINCT FROM $2 AND status IN ('pending', 'running')`, s.key, s.jobID, reason)
				if err != nil || tag.RowsAffected() == 0 {
					return err
				}
				res.Failed = append(res.Failed, s.key)
				_, err = tx.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, to_state, actor, detail)
					VALUES ($1, 'run.finish', 'failed', 'maintenance', jsonb_build_object('error', $2::text))`, s.key, reason)
				return err
			}

			opts := &river.InsertOpts{MaxAttempts: maxAttempts}
			if s.queue != nil {
				opts.Queue = *s.queue
			}
			if s.priority != nil {
				opts.Priority = *s.priority
			}
			var err error
			if opts.Metadata, err = withRunKey(nil, s.key); err != nil {
				return err
			}
			ins, err := client.InsertTx(ctx, tx, rawArgs{kind: s.kind, raw: s.input}, opts)
			if err != nil {
				return fmt.Errorf("re-enqueueing run %q: %w", s.key, err)
			}
			tag, err := tx.Exec(ctx, `UPDATE stepwise_run SET river_job_id = $3, updated_at = now()
				WHERE key = $1 AND river_job_id IS NOT DISTINCT FROM $2 AND status IN ('pending', 'running')`,
				s.key, s.jobID, ins.Job.ID)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return errSkip // another pass got there first; roll back our job
			}
			res.TakenOver = append(res.TakenOver, s.key)
			_, err = tx.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, actor, detail)
				VALUES ($1, 'run.takeover', 'maintenance', jsonb_build_object('old_job', $2::bigint, 'new_job', $3::bigint))`,
				s.key, s.jobID, ins.Job.ID)
			return err
		})
		if err != nil && !errors.Is(err, errSkip) {
			return res, fmt.Errorf("taking over run %q: %w", s.key, err)
		}
	}
	e.metrics.takeovers.Add(float64(len(res.TakenOver)))
	for _, k := range res.TakenOver {
		e.logger.InfoContext(ctx, "stepwise: run taken over after its worker vanished", "run", k)
	}
	for _, k := range res.Failed {
		e.logger.WarnContext(ctx, "stepwise: run failed by maintenance", "run", k)
	}
	return res, nil
}

var errSkip = errors.New("skip")

// RunMaintenance runs Maintain every MaintenanceInterval (with jitter) until ctx ends. Call it
// in a goroutine of every worker process when takeover must not wait for River's leader: the
// periodic job runs on River's elected leader only, and when the process that dies is the
// leader, a new one is elected only after River's leadership TTL (measured here: takeover
// 16.8-18.7 s instead of 2.2 s with a 2 s lease). Passes in several processes at once are
// safe: each takeover is a compare-and-set on the run's job id.
func (e *Engine) RunMaintenance(ctx context.Context, client *river.Client[pgx.Tx]) error {
	if client == nil {
		return errors.New("workflow.RunMaintenance: client is nil")
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(e.cfg.MaintenanceInterval + jitter(e.cfg.MaintenanceInterval/5+time.Millisecond)):
		}
		if _, err := e.Maintain(ctx, client); err != nil && ctx.Err() == nil {
			e.logger.WarnContext(ctx, "stepwise: maintenance pass failed", "error", err)
		}
	}
}
