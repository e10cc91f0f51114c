package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/checkpoint"
	"github.com/stepwise-go/stepwise/internal/pgtx"
	"github.com/stepwise-go/stepwise/internal/slotrun"
)

// metadataRunKey is the River job metadata field that names the run a job delivers. Keeping
// the key in metadata leaves the user's job args exactly as they wrote them.
const metadataRunKey = "stepwise_run"

// RunKeyer may be implemented by job args to give jobs inserted with plain River Insert
// (without Start) a run key.
type RunKeyer interface {
	RunKey() string
}

// Run is a run of a step function as stored in stepwise_run.
type Run struct {
	Key        string
	Workflow   string
	Input      json.RawMessage
	Status     RunStatus
	Schedule   *string
	Slot       *time.Time
	Shard      *int
	RiverJobID *int64
	// Attempts counts claims: one per attempt of the run's jobs, so one per slice.
	Attempts int
	// Failures counts what the crash-loop guard counts: takeovers of a worker that vanished,
	// and step errors, in a row since the run last committed a step (a failure after
	// progress restarts the count at 1). The run fails when they reach its job's MaxAttempts.
	Failures  int
	LastError *string
	// WakeAt is when a run that released its lease on purpose (Sleep, Until) is due again.
	WakeAt     *time.Time
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt *time.Time
	// CancelRequestedAt is when CancelRun was called, if it was.
	CancelRequestedAt *time.Time
	// HistoryPrunedAt is when package retention deleted the run's events (its row and
	// checkpoint stay, so the key still names this run and a failed run still resumes).
	HistoryPrunedAt *time.Time

	// Created is true when the Start call that returned this Run created it.
	Created bool
}

// StartOpts are options for Start and StartTx. A run started here belongs to no schedule:
// only package schedule starts runs with a schedule, slot and shard recorded (Run.Schedule,
// Run.Slot, Run.Shard), so a slot's runs are the ones its schedule started.
type StartOpts struct {
	// InsertOpts are passed to River for the run's job (queue, priority, max attempts...).
	InsertOpts *river.InsertOpts
}

// Start starts the run key of args's workflow in its own transaction. See StartTx.
func Start[A river.JobArgs](ctx context.Context, client *river.Client[pgx.Tx], key string, args A, opts *StartOpts) (*Run, error) {
	if client == nil {
		return nil, errors.New("workflow.Start: client is nil")
	}
	execTx, err := client.Driver().GetExecutor().Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("starting run %q: %w", key, err)
	}
	tx := client.Driver().UnwrapTx(execTx)
	defer pgtx.Rollback(ctx, tx)
	run, err := StartTx(ctx, client, tx, key, args, opts)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("starting run %q: committing: %w", key, err)
	}
	return run, nil
}

// StartTx starts a run in tx: it records the run and its checkpoint and inserts the River job
// that delivers it, all in the caller's transaction. A key names one run forever: starting
// the same key again with the same workflow and input returns the existing run (Created is
// false) and inserts no job, so "the cron fired twice" or "the caller retried" cannot start a
// second run. The same key with another workflow or input is ErrRunConflict. This holds after
// retention too: package retention never deletes a run's row, only its events.
func StartTx[A river.JobArgs](ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, key string, args A, opts *StartOpts) (*Run, error) {
	var insertOpts *river.InsertOpts
	if opts != nil {
		insertOpts = opts.InsertOpts
	}
	return startTx(ctx, client, tx, key, args, insertOpts, nil)
}

func init() {
	// Package schedule starts the runs of its slots through this, with the slot recorded.
	slotrun.StartTx = func(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, key string, args river.JobArgs, opts *river.InsertOpts, slot slotrun.Slot) (bool, error) {
		run, err := startTx(ctx, client, tx, key, args, opts, &slot)
		if err != nil {
			return false, err
		}
		return run.Created, nil
	}
}

// startTx is StartTx for any args, with the run's slot when a schedule starts it.
func startTx(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, key string, args river.JobArgs, opts *river.InsertOpts, in *slotrun.Slot) (*Run, error) {
	if err := checkpoint.ValidateKey(key); err != nil {
		return nil, fmt.Errorf("workflow.Start: run %w", err)
	}
	input, err := json.Marshal(args)
	if err != nil {
		return nil, fmt.Errorf("workflow.Start: encoding input of run %q: %w", key, err)
	}
	kind := args.Kind()
	var (
		schedule *string
		slot     *time.Time
		shard    *int
	)
	if in != nil {
		sl, sh := in.Time.UTC(), in.Shard
		schedule, slot, shard = &in.Schedule, &sl, &sh
	}
	if err := checkpoint.Ensure(ctx, tx, key); err != nil {
		return nil, err
	}
	created, err := insertRun(ctx, tx, key, kind, input, schedule, slot, shard)
	if err != nil {
		return nil, fmt.Errorf("workflow.Start: recording run %q: %w", key, err)
	}
	if !created {
		run, err := GetRun(ctx, tx, key)
		if err != nil {
			return nil, err
		}
		var same bool
		if err := tx.QueryRow(ctx, `SELECT input = $2::jsonb FROM stepwise_run WHERE key = $1`, key, input).Scan(&same); err != nil {
			return nil, fmt.Errorf("workflow.Start: comparing run %q: %w", key, err)
		}
		if run.Workflow != kind || !same {
			return nil, fmt.Errorf("%w: key %q is run of %s with input %s; this start is %s with input %s",
				ErrRunConflict, key, run.Workflow, run.Input, kind, input)
		}
		return run, nil
	}

	insertOpts := river.InsertOpts{}
	if opts != nil {
		insertOpts = *opts
	}
	if insertOpts.Metadata, err = withRunKey(insertOpts.Metadata, key); err != nil {
		return nil, fmt.Errorf("workflow.Start: run %q: InsertOpts.Metadata: %w", key, err)
	}
	res, err := client.InsertTx(ctx, tx, args, &insertOpts)
	if err != nil {
		return nil, fmt.Errorf("workflow.Start: inserting River job for run %q: %w", key, err)
	}
	if err := linkStartedRun(ctx, tx, key, res.Job.ID); err != nil {
		return nil, fmt.Errorf("workflow.Start: linking run %q to its job: %w", key, err)
	}
	run, err := GetRun(ctx, tx, key)
	if err != nil {
		return nil, err
	}
	run.Created = true
	return run, nil
}

func withRunKey(metadata []byte, key string) ([]byte, error) {
	m := map[string]any{}
	if len(metadata) > 0 {
		if err := json.Unmarshal(metadata, &m); err != nil {
			return nil, err
		}
	}
	m[metadataRunKey] = key
	return json.Marshal(m)
}

// runKeyOf finds the run a job delivers: the key Start put in its metadata, else the args'
// RunKey method.
func runKeyOf(metadata []byte, args any) (string, error) {
	if len(metadata) > 0 {
		var m map[string]any
		if err := json.Unmarshal(metadata, &m); err == nil {
			if k, ok := m[metadataRunKey].(string); ok && k != "" {
				return k, nil
			}
		}
	}
	if rk, ok := args.(RunKeyer); ok {
		key := rk.RunKey()
		if err := checkpoint.ValidateKey(key); err != nil {
			return "", fmt.Errorf("RunKey() of %T: %w", args, err)
		}
		return key, nil
	}
	return "", fmt.Errorf("job args %T carry no run key: start runs with workflow.Start, or give the args a RunKey() string method", args)
}

// GetRun reads one run.
func GetRun(ctx context.Context, q stepwise.DBTX, key string) (*Run, error) {
	r := &Run{Key: key}
	err := q.QueryRow(ctx, `SELECT workflow, input, status, schedule, slot, shard, river_job_id, attempts, failures,
			last_error, wake_at, created_at, updated_at, finished_at, cancel_requested_at, history_pruned_at
		FROM stepwise_run WHERE key = $1`, key).
		Scan(&r.Workflow, &r.Input, &r.Status, &r.Schedule, &r.Slot, &r.Shard, &r.RiverJobID, &r.Attempts, &r.Failures,
			&r.LastError, &r.WakeAt, &r.CreatedAt, &r.UpdatedAt, &r.FinishedAt, &r.CancelRequestedAt, &r.HistoryPrunedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %q", ErrRunNotFound, key)
	}
	if err != nil {
		return nil, fmt.Errorf("reading run %q: %w", key, err)
	}
	return r, nil
}

// CancelRun asks for a run to stop cooperatively: a run that has not started ends
// 'cancelled' at its next claim; a running one has its step's context cancelled within about
// Config.Heartbeat, its open step rolled back, and ends 'cancelled' with reason recorded; one
// that is not being worked (sleeping, or waiting for River's retry) is ended 'cancelled' by
// the next maintenance pass, within about MaintenanceInterval.
// Committed steps stay committed. Cancelling a finished run does nothing and returns nil.
func CancelRun(ctx context.Context, q stepwise.DBTX, key, reason string) error {
	if err := requestCancel(ctx, q, key, reason); err != nil {
		return fmt.Errorf("requesting cancellation of run %q: %w", key, err)
	}
	return nil
}

// Resume continues a failed or cancelled run from its last committed cursor: the run goes
// back to pending under a new River job (same queue, priority and max attempts as its last
// job, when River still has it) with a fresh crash-loop budget, and the checkpoint is left
// as committed, so no committed step is redone. actor (who) and reason (why, e.g. a ticket)
// are required and recorded in the run's 'run.resume' event. A succeeded run is never redone;
// a pending or running one is refused (it is not stopped).
func Resume(ctx context.Context, client *river.Client[pgx.Tx], key, actor, reason string) error {
	switch {
	case client == nil:
		return errors.New("workflow.Resume: client is nil")
	case actor == "":
		return fmt.Errorf("workflow.Resume(%q): actor is empty; say who resumes the run, for the audit trail", key)
	case reason == "":
		return fmt.Errorf("workflow.Resume(%q): reason is empty; say why the run can go on now (e.g. the incident fixed)", key)
	}
	execTx, err := client.Driver().GetExecutor().Begin(ctx)
	if err != nil {
		return fmt.Errorf("resuming run %q: %w", key, err)
	}
	tx := client.Driver().UnwrapTx(execTx)
	defer pgtx.Rollback(ctx, tx)
	run, err := GetRun(ctx, tx, key)
	if err != nil {
		return fmt.Errorf("workflow.Resume: %w", err)
	}
	if run.Status != StatusFailed && run.Status != StatusCancelled {
		return fmt.Errorf("workflow.Resume(%q): the run is %s; only a failed or cancelled run can be resumed", key, run.Status)
	}
	opts := &river.InsertOpts{}
	if run.RiverJobID != nil {
		var queue string
		var priority, maxAttempts int
		err := tx.QueryRow(ctx, `SELECT queue, priority, max_attempts FROM river_job WHERE id = $1`, *run.RiverJobID).Scan(&queue, &priority, &maxAttempts)
		switch {
		case err == nil:
			opts.Queue, opts.Priority, opts.MaxAttempts = queue, priority, maxAttempts
		case !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("resuming run %q: reading its last job: %w", key, err)
		}
	}
	if opts.Metadata, err = withRunKey(nil, key); err != nil {
		return err
	}
	ins, err := client.InsertTx(ctx, tx, rawArgs{kind: run.Workflow, raw: run.Input}, opts)
	if err != nil {
		return fmt.Errorf("resuming run %q: inserting its River job: %w", key, err)
	}
	// Guards: two resumes at once, or a run that changed since it was read.
	ok, err := resumeRun(ctx, tx, key, run.Status, ins.Job.ID, actor, reason)
	if err != nil {
		return fmt.Errorf("resuming run %q: %w", key, err)
	}
	if !ok {
		return fmt.Errorf("resuming run %q: %w", key, errRunMoved)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("resuming run %q: committing: %w", key, err)
	}
	return nil
}
