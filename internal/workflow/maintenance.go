package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise/internal/jitter"
	"github.com/stepwise-go/stepwise/internal/runstart"
)

// maintenanceArgs are the args of Stepwise's leader-run maintenance job.
type maintenanceArgs struct{}

// Kind is the River job kind of the maintenance job.
func (maintenanceArgs) Kind() string { return "stepwise_maintenance" }

type maintenanceWorker struct {
	river.WorkerDefaults[maintenanceArgs]
	e *Engine
}

func (w *maintenanceWorker) Work(ctx context.Context, job *river.Job[maintenanceArgs]) error {
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
	// Failed are runs ended as failed because their crashes used up their attempts or their
	// River job ended without finishing them.
	Failed []string
	// Cancelled are runs CancelRun asked to stop that no worker was working (asleep, or
	// waiting for a retry), ended as cancelled.
	Cancelled []string
	// Woken are waiting runs made due by the backstop: their condition held (or they were
	// woken) and no wake had reached them.
	Woken []string
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
//
// A pass does four index-driven things, so its cost does not grow with the backlog of
// pending or sleeping runs:
//
//   - takeover of expired leases (a worker killed or frozen mid-run, the common case):
//     driven by the index on stepwise_checkpoint.lease_until, a few rows. Only the lease the
//     job's own fetch took counts (leaseOfJobSQL). Takeover after about Lease +
//     MaintenanceInterval;
//   - takeover of running jobs with no lease of their own (a worker that died after River
//     fetched its job and before it claimed, or after it released and before River recorded
//     the snooze; the lapsed lease of another job, left by the holder a takeover replaced):
//     a page of 100 of River's running jobs per pass, resuming where the last pass stopped,
//     so a full round takes (running jobs / 100) passes. Such a job is left alone for two
//     Leases past its fetch, and a run its worker released on purpose for two Leases past
//     the release (unleasedGrace; the rule in runstate.go);
//   - sweep: a page of unfinished runs by key, resuming where the last pass stopped, for
//     runs whose River job ended or vanished without finishing them (rare: an operator
//     cancelled or deleted the job). A full sweep takes (unfinished runs / 100) passes;
//   - cancellation: runs CancelRun asked to stop that no worker is working (sleeping,
//     waiting for a retry), ended 'cancelled' with their River job cancelled.
//
// Every change is one of runstate.go's transitions, conditional on what the pass saw: a run
// whose worker renewed its lease, or that finished, meanwhile is left alone.
func (e *Engine) Maintain(ctx context.Context, client *river.Client[pgx.Tx]) (*MaintenanceResult, error) {
	if client == nil {
		return nil, errors.New("workflow.Maintain: client is nil")
	}
	res := &MaintenanceResult{}
	// Takeover of vanished workers: the job is still 'running' but nobody holds the lease.
	rows, err := e.pool.Query(ctx, expiredScanSQL, e.cfg.Lease.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("finding runs whose worker vanished: %w", err)
	}
	crashed, err := pgx.CollectRows(rows, scanStuck)
	if err != nil {
		return nil, fmt.Errorf("finding runs whose worker vanished: %w", err)
	}
	e.sweepMu.Lock()
	afterJob := e.runningAfter
	e.sweepMu.Unlock()
	var lastJob *int64
	var pageLen int
	if err := e.pool.QueryRow(ctx, runningPageSQL, afterJob, sweepPage).Scan(&lastJob, &pageLen); err != nil {
		return nil, fmt.Errorf("paging River's running jobs: %w", err)
	}
	if pageLen > 0 {
		rows, err = e.pool.Query(ctx, unleasedScanSQL, e.unleasedGrace().Milliseconds(), afterJob, *lastJob)
		if err != nil {
			return nil, fmt.Errorf("finding running jobs without a lease: %w", err)
		}
		unleased, err := pgx.CollectRows(rows, scanStuck)
		if err != nil {
			return nil, fmt.Errorf("finding running jobs without a lease: %w", err)
		}
		crashed = append(crashed, unleased...)
	}
	e.sweepMu.Lock()
	e.runningAfter = 0
	if pageLen == sweepPage {
		e.runningAfter = *lastJob
	}
	e.sweepMu.Unlock()

	// The sweep: one page of unfinished runs, for jobs that ended or vanished.
	e.sweepMu.Lock()
	after := e.sweepAfter
	e.sweepMu.Unlock()
	rows, err = e.pool.Query(ctx, sweepScanSQL, after, sweepPage)
	if err != nil {
		return nil, fmt.Errorf("sweeping unfinished runs: %w", err)
	}
	page, err := pgx.CollectRows(rows, scanStuck)
	if err != nil {
		return nil, fmt.Errorf("sweeping unfinished runs: %w", err)
	}
	next := ""
	if len(page) == sweepPage {
		next = page[len(page)-1].key
	}
	e.sweepMu.Lock()
	e.sweepAfter = next
	e.sweepMu.Unlock()
	for _, s := range page {
		// The lease is rechecked under lock by rescue (lockLapsed).
		if s.jobState == nil || *s.jobState == "completed" || *s.jobState == "discarded" || *s.jobState == "cancelled" {
			crashed = append(crashed, s)
		}
	}

	for _, s := range crashed {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return e.rescue(ctx, client, tx, s, res) })
		if err != nil && !errors.Is(err, errSkip) {
			return res, fmt.Errorf("taking over run %q: %w", s.key, err)
		}
	}
	if err := e.cancelIdle(ctx, client, res); err != nil {
		return res, err
	}
	if err := e.waitBackstop(ctx, res); err != nil {
		return res, err
	}
	for _, k := range res.Woken {
		e.logger.WarnContext(ctx, "stepwise: waiting run woken by maintenance: no commit had woken it", "run", k)
	}
	e.metrics.takeovers.Add(float64(len(res.TakenOver)))
	for _, k := range res.TakenOver {
		e.logger.InfoContext(ctx, "stepwise: run taken over after its worker vanished", "run", k)
	}
	for _, k := range res.Failed {
		e.logger.WarnContext(ctx, "stepwise: run failed by maintenance", "run", k)
	}
	for _, k := range res.Cancelled {
		e.logger.InfoContext(ctx, "stepwise: idle run cancelled by maintenance", "run", k)
	}
	return res, nil
}

// sweepPage is how many unfinished runs one pass sweeps for ended jobs.
const sweepPage = 100

type stuckRun struct {
	seenRun
	jobState    *string
	kind        string
	input       json.RawMessage
	queue       *string
	priority    *int
	maxAttempts *int
	wakeAt      *time.Time
	// fetchedBy and fetchedAt are the River client that last fetched the run's job and when,
	// as the scan saw them: the takeover records them (see takeOver).
	fetchedBy *string
	fetchedAt *time.Time
}

func scanStuck(row pgx.CollectableRow) (stuckRun, error) {
	var s stuckRun
	err := row.Scan(&s.key, &s.jobID, &s.jobState, &s.failures, &s.token, &s.kind, &s.input, &s.queue, &s.priority, &s.maxAttempts, &s.wakeAt,
		&s.steps, &s.failedAtSteps, &s.fetchedBy, &s.fetchedAt)
	return s, err
}

// rescue takes a stuck run over, or fails it, in tx.
func (e *Engine) rescue(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, s stuckRun, res *MaintenanceResult) (err error) {
	// The takeover's span: the new job carries its context, so the run's next attempt links
	// back to the takeover that queued it.
	ctx, span := e.tracer.Start(ctx, "stepwise.takeover")
	outcome := "skipped"
	defer func() { endTakeoverSpan(span, s, outcome, err) }()
	maxAttempts := river.MaxAttemptsDefault
	if s.maxAttempts != nil {
		maxAttempts = *s.maxAttempts
	}
	// A run whose job River discarded or cancelled, or whose crashes and step errors in a row,
	// without committed progress between them, reach the attempts its job allows, ends failed
	// and visible: re-enqueueing a crash loop forever would hide it. Slices are not counted (an
	// hour-long run is claimed once a slice), and neither are failures before the run's last
	// progress: a long run on machines that crash now and then is not a crash loop. The rule
	// is the one takeOver and markStepError record (failureCount).
	reason := ""
	switch next := s.failuresNext(); {
	case s.jobState != nil && (*s.jobState == "discarded" || *s.jobState == "cancelled"):
		reason = fmt.Sprintf("its River job %d ended %s without finishing the run", *s.jobID, *s.jobState)
	case next >= maxAttempts:
		reason = fmt.Sprintf("its worker vanished and it has failed %d times in a row without progress (at %d steps), its job's max attempts (%d): a crash loop",
			next, s.steps, maxAttempts)
	}
	// Guards: a worker that renewed its lease (or a claim, or a commit) after the scan.
	// Failing also moves the token on, so that worker, should it wake, can neither renew nor
	// commit.
	ok, err := lockLapsed(ctx, tx, s.seenRun, reason != "")
	if err != nil || !ok {
		return errors.Join(err, errSkip)
	}
	if reason != "" {
		ok, err := finishByMaintenance(ctx, tx, s.seenRun, RunStatusFailed, reason)
		if err != nil || !ok {
			return errors.Join(err, errSkip)
		}
		res.Failed = append(res.Failed, s.key)
		outcome = "failed"
		return nil
	}

	opts := &river.InsertOpts{MaxAttempts: maxAttempts}
	if s.queue != nil {
		opts.Queue = *s.queue
	}
	if s.priority != nil {
		opts.Priority = *s.priority
	}
	// A run that died asleep (released for a Sleep, River never recorded the snooze) keeps
	// its wake time.
	if s.wakeAt != nil && s.wakeAt.After(time.Now()) {
		opts.ScheduledAt = *s.wakeAt
	}
	if opts.Metadata, err = runstart.WithRunKey(ctx, nil, s.key); err != nil {
		return err
	}
	ins, err := client.InsertTx(ctx, tx, rawArgs{kind: s.kind, raw: s.input}, opts)
	if err != nil {
		return fmt.Errorf("re-enqueueing run %q: %w", s.key, err)
	}
	why := "worker vanished"
	if s.jobState == nil {
		why = "job vanished"
	} else if *s.jobState != "running" {
		why = "job " + *s.jobState + " without finishing the run"
	}
	ok, err = takeOver(ctx, tx, s.seenRun, ins.Job.ID, why, s.wakeAt, s.fetchedBy, s.fetchedAt)
	if err != nil {
		return err
	}
	if !ok {
		return errSkip // another pass got there first; roll back our job
	}
	res.TakenOver = append(res.TakenOver, s.key)
	outcome = "taken_over"
	return nil
}

// cancelIdle ends runs whose cancellation was requested while no worker works them: a
// sleeping run, or one waiting for River's retry, would otherwise stay until it woke.
func (e *Engine) cancelIdle(ctx context.Context, client *river.Client[pgx.Tx], res *MaintenanceResult) error {
	rows, err := e.pool.Query(ctx, cancelScanSQL)
	if err != nil {
		return fmt.Errorf("finding idle runs to cancel: %w", err)
	}
	idle, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (seenRun, error) {
		var s seenRun
		return s, row.Scan(&s.key, &s.jobID, &s.token, &s.failures, &s.steps, &s.failedAtSteps)
	})
	if err != nil {
		return fmt.Errorf("finding idle runs to cancel: %w", err)
	}
	for _, s := range idle {
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			// Guards: a worker that claimed the run after the scan (it will cancel the run
			// itself); fencing stops any worker that would claim it later from committing.
			ok, err := lockLapsed(ctx, tx, s, true)
			if err != nil || !ok {
				return errors.Join(err, errSkip)
			}
			ok, err = finishByMaintenance(ctx, tx, s, RunStatusCancelled, "cancelled while idle: "+cancelReason(ctx, tx, s.key))
			if err != nil || !ok {
				return errors.Join(err, errSkip)
			}
			if s.jobID != nil {
				if _, err := client.JobCancelTx(ctx, tx, *s.jobID); err != nil && !errors.Is(err, river.ErrNotFound) {
					return fmt.Errorf("cancelling River job %d of run %q: %w", *s.jobID, s.key, err)
				}
			}
			res.Cancelled = append(res.Cancelled, s.key)
			return nil
		})
		if err != nil && !errors.Is(err, errSkip) {
			return fmt.Errorf("cancelling idle run %q: %w", s.key, err)
		}
	}
	return nil
}

func cancelReason(ctx context.Context, tx pgx.Tx, key string) string {
	var reason *string
	_ = tx.QueryRow(ctx, `SELECT last_error FROM stepwise_run WHERE key = $1`, key).Scan(&reason)
	return deref(reason)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
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
		case <-time.After(e.cfg.MaintenanceInterval + jitter.UpTo(e.cfg.MaintenanceInterval/5+time.Millisecond)):
		}
		if _, err := e.Maintain(ctx, client); err != nil && ctx.Err() == nil {
			e.logger.WarnContext(ctx, "stepwise: maintenance pass failed", "error", err)
		}
	}
}

// unleasedGrace is how long a running job whose run holds no lease of the job's own fetch
// (none, or another job's lapsed one) is left alone: past its
// fetch (attempted_at), and past its run's release on purpose (released_at). Two Leases,
// where a lapsed lease (expiredScanSQL) is taken over after one. Guards against: a live but
// starved worker taken over. A held lease is renewed every third of a Lease, so its holder
// proves itself alive throughout; nothing renews these two states, which a live worker
// leaves at its next statement (the claim; River recording the snooze) — in milliseconds on
// a healthy machine, but measured at over 2 s on a 2-core machine beside a CPU hog
// (the chaos long profile, 2 s Lease: a run taken over 2.35 s after a live worker fetched its
// job and before its claim). A worker that really dies inside one of them is rare (its
// window is those milliseconds), so the second Lease costs recovery time only then; the
// common crash, a worker killed holding the lease of its own fetch, is still taken over
// after one.
func (e *Engine) unleasedGrace() time.Duration { return 2 * e.cfg.Lease }

// The scans of a maintenance pass. Each is driven by a small index range, so a pass costs the
// same with a hundred thousand pending runs as with none (BenchmarkMaintainPass shows the
// plans): expired leases by stepwise_checkpoint_lease_idx; running jobs by river_job's
// (state, ...) index, a page at a time, then stepwise_run_job_idx; the sweep by
// stepwise_run_active_key_idx from the last key; cancellations by stepwise_run_cancel_idx.
const (
	// Expired leases: a worker killed or frozen while it held the run. Only the lease of the
	// job's own fetch counts (leaseOfJobSQL): its owner names the fetching client, the job and
	// the attempt, and it outlived the fetch. A takeover moves the run's job,
	// not the checkpoint, so the lease on it may be another job's: the dead holder's lapsed
	// lease, left until the next claim (TestSlowClaimAfterTakeoverIsNotTakenOverAgain), or
	// that holder's, renewed by its heartbeat when it thawed for a moment after the new job's
	// fetch (a takeover does not move the token, so the renewal holds) before it froze again
	// (TestThawedHolderRenewalIsNotTheFetchersLease). Judging the new job by such a lease
	// would take its worker, alive and starved between fetch and claim, over after one Lease
	// instead of unleasedGrace: such a job is the unleased scan's.
	expiredScanSQL = `
		SELECT r.key, r.river_job_id, j.state::text, r.failures, c.fencing_token, r.workflow, r.input,
		       j.queue, j.priority, j.max_attempts, r.wake_at, c.steps, r.failed_at_steps,
		       j.attempted_by[cardinality(j.attempted_by)], j.attempted_at
		  FROM stepwise_checkpoint c
		  JOIN stepwise_run r ON r.key = c.key AND r.status IN ('pending', 'running')
		  JOIN river_job j ON j.id = r.river_job_id
		 WHERE c.lease_until IS NOT NULL AND c.lease_until < now()
		   AND j.state = 'running'
		   AND j.attempted_at < now() - $1 * interval '1 millisecond'
		   AND ` + leaseOfJobSQL + `
		 LIMIT 100`
	// leaseOfJobSQL: the checkpoint's lease is the one the job's current fetch took: its owner
	// is the one the worker writes (ownerOf, worker.go) for the client that last fetched the
	// job, the job and its attempt, and it outlived the fetch. The owner alone is not enough:
	// River lowers a snoozed job's attempt again, so two fetches of one job by one client can
	// share it. The coalesce matters: the unleased scan takes NOT of this, and NOT of a NULL
	// (no attempted_by) would drop the row from both scans.
	leaseOfJobSQL = `coalesce(c.owner = j.attempted_by[cardinality(j.attempted_by)] || '/job-' || j.id || '/attempt-' || j.attempt
		AND c.lease_until > j.attempted_at, false)`
	// A page of River's running jobs, by id. "id + 0" keeps the planner on the state index
	// (a top-N sort of the running jobs) instead of walking the primary key past every
	// finished and waiting job.
	runningPageSQL = `
		SELECT max(id), count(*)::int FROM (
			SELECT id FROM river_job WHERE state = 'running' AND id > $1 ORDER BY id + 0 LIMIT $2
		) p`
	// The page's jobs whose run holds no lease of the job's own fetch (none at all, or a
	// lapsed one of another job, attempt or fetch: the expired scan's complement), fetched and
	// released (if at all) more than unleasedGrace ($1) ago. Another job's lease that has not
	// lapsed is its holder's, alive: left alone.
	unleasedScanSQL = `
		SELECT r.key, r.river_job_id, j.state::text, r.failures, c.fencing_token, r.workflow, r.input,
		       j.queue, j.priority, j.max_attempts, r.wake_at, c.steps, r.failed_at_steps,
		       j.attempted_by[cardinality(j.attempted_by)], j.attempted_at
		  FROM river_job j
		  JOIN stepwise_run r ON r.river_job_id = j.id AND r.status IN ('pending', 'running')
		  JOIN stepwise_checkpoint c ON c.key = r.key
		 WHERE j.state = 'running' AND j.id > $2 AND j.id <= $3
		   AND j.attempted_at < now() - $1 * interval '1 millisecond'
		   AND (c.lease_until IS NULL OR (c.lease_until < now() AND NOT ` + leaseOfJobSQL + `))
		   AND (r.released_at IS NULL OR r.released_at < j.attempted_at
		        OR r.released_at < now() - $1 * interval '1 millisecond')`
	// The sweep: a page of unfinished runs by key, each one's checkpoint and job read by
	// their keys. The OFFSET 0 keeps each lookup an index probe per run: joined plainly, with
	// 10,000 runs waiting (BenchmarkMaintainPassWaiting) the planner hash-joined the page
	// with sequential scans of every checkpoint and every River job (3 ms a pass, growing
	// with the tables until it switches plans), instead of 200 probes.
	sweepScanSQL = `
		SELECT r.key, r.river_job_id, j.state::text, r.failures, c.fencing_token, r.workflow, r.input,
		       j.queue, j.priority, j.max_attempts, r.wake_at, c.steps, r.failed_at_steps,
		       j.last_by, j.attempted_at
		  FROM (SELECT * FROM stepwise_run WHERE status IN ('pending', 'running') AND key > $1 ORDER BY key LIMIT $2) r
		  JOIN LATERAL (SELECT c.fencing_token, c.steps FROM stepwise_checkpoint c WHERE c.key = r.key OFFSET 0) c ON true
		  LEFT JOIN LATERAL (SELECT j.state, j.queue, j.priority, j.max_attempts, j.attempted_by[cardinality(j.attempted_by)] AS last_by, j.attempted_at
		                       FROM river_job j WHERE j.id = r.river_job_id OFFSET 0) j ON true
		 ORDER BY r.key`
	cancelScanSQL = `
		SELECT r.key, r.river_job_id, c.fencing_token, r.failures, c.steps, r.failed_at_steps
		  FROM stepwise_run r
		  JOIN stepwise_checkpoint c ON c.key = r.key
		  LEFT JOIN river_job j ON j.id = r.river_job_id
		 WHERE r.cancel_requested_at IS NOT NULL AND r.status IN ('pending', 'running')
		   AND (c.lease_until IS NULL OR c.lease_until < now())
		   AND (j.id IS NULL OR j.state IN ('available', 'scheduled', 'retryable', 'pending'))
		 LIMIT 100`
)
