package stepwise

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/audittext"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/pgtx"
	schedengine "github.com/stepwise-go/stepwise/internal/schedule"
	wfengine "github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/stepwisetype"
	"github.com/stepwise-go/stepwise/workflow"
)

// The operator actions: what a person (through a console, a command, a support tool) reads
// and does to runs, operations and schedules. Each is a method named noun first, as River's
// JobCancel and QueuePause, with a Tx variant that works in the caller's transaction so a
// tool can record the decision beside its own writes (its audit row, a ticket's state). Every
// action a person takes carries Opts with Actor and Reason (both required, recorded in the
// audit trail); a decision on something that moves (resuming a run, resolving an operation)
// also carries ExpectedVersion, the version the person saw, and is refused with an error
// matching stepwisetype.ErrChanged if it moved since. Not-found errors match
// stepwisetype.ErrNotFound as well as the package's own sentinel.

// ErrRunNotCancellable is returned by RunCancel for a run that is already finished
// (succeeded, failed or cancelled): nothing was done.
var ErrRunNotCancellable = errors.New("stepwise: run not cancellable")

// errKindWithoutConfig is returned by OperationResolve for an operation whose kind this
// Client has no outbox KindConfig for (and NoCallback is not set): the kind's outcome
// callback, the service's business state that moves with the operation, cannot run here.
// Callers match outbox.ErrUnknownKind; the message says what to do.
var errKindWithoutConfig = fmt.Errorf("%w: this client cannot run the kind's outcome callback", outbox.ErrUnknownKind)

// tagged is an error that also matches a client-level sentinel (stepwisetype.ErrNotFound,
// stepwisetype.ErrChanged) while keeping the package's own error and text.
type tagged struct {
	err error
	tag error
}

func (e *tagged) Error() string   { return e.err.Error() }
func (e *tagged) Unwrap() []error { return []error{e.err, e.tag} }

// wrapErr tags the packages' not-found and changed errors with the client's sentinels.
func wrapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, stepwisetype.ErrNotFound), errors.Is(err, stepwisetype.ErrChanged):
		return err
	case errors.Is(err, wfengine.ErrRunNotFound), errors.Is(err, outbox.ErrNotFound),
		errors.Is(err, schedengine.ErrNotFound), errors.Is(err, schedengine.ErrSlotNotFound):
		return &tagged{err: err, tag: stepwisetype.ErrNotFound}
	case errors.Is(err, wfengine.ErrRunChanged), errors.Is(err, outbox.ErrStateChanged):
		return &tagged{err: err, tag: stepwisetype.ErrChanged}
	}
	return err
}

// checkActor checks the Actor and Reason of a person's action: required, and free of control
// and invisible formatting characters that would make the audit trail read otherwise than
// it was written.
func checkActor(what, actor, reason string) error {
	switch {
	case actor == "":
		return fmt.Errorf("%s: Actor is empty: say who acts, for the audit trail", what)
	case reason == "":
		return fmt.Errorf("%s: Reason is empty: say why, for the audit trail (a ticket, what the bank said)", what)
	}
	if err := audittext.Check("Actor", actor); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := audittext.Check("Reason", reason); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func (c *Client) checkPool(what string) error {
	if c == nil || c.pool == nil {
		return fmt.Errorf("stepwise.Client.%s: the client has no database pool: build it with NewClient", what)
	}
	return nil
}

// inTx runs fn in a transaction of the client's pool and commits it.
func (c *Client) inTx(ctx context.Context, what string, fn func(tx pgx.Tx) error) error {
	if err := c.checkPool(what); err != nil {
		return err
	}
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("stepwise.Client.%s: beginning: %w", what, err)
	}
	defer pgtx.Rollback(ctx, tx)
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("stepwise.Client.%s: committing: %w", what, err)
	}
	return nil
}

// --- runs ---

// RunGet reads a run with its derived retry state (Run.Retry).
func (c *Client) RunGet(ctx context.Context, key string) (*workflow.Run, error) {
	if err := c.checkPool("RunGet"); err != nil {
		return nil, err
	}
	return c.runGet(ctx, c.pool, key)
}

// RunGetTx is RunGet in the caller's transaction.
func (c *Client) RunGetTx(ctx context.Context, tx pgx.Tx, key string) (*workflow.Run, error) {
	return c.runGet(ctx, tx, key)
}

func (c *Client) runGet(ctx context.Context, q stepwisetype.DBTX, key string) (*workflow.Run, error) {
	run, err := wfengine.GetRun(ctx, q, key)
	return run, wrapErr(err)
}

// RunListParams selects runs for RunList. Every filter is optional.
type RunListParams struct {
	// Status selects runs in this status.
	Status workflow.RunStatus
	// Workflow selects runs of this workflow (the River job kind of their args).
	Workflow string
	// Schedule selects the runs this schedule started.
	Schedule string
	// KeyPrefix selects runs whose key starts with it (as text: "_" and "%" are ordinary).
	KeyPrefix string
	// Limit caps the result: 1 to 1000, 0 for 100.
	Limit int
}

// RunList lists runs, newest first. Replaces the console's and the command's own queries.
func (c *Client) RunList(ctx context.Context, params *RunListParams) ([]*workflow.Run, error) {
	if err := c.checkPool("RunList"); err != nil {
		return nil, err
	}
	return runList(ctx, c.pool, params)
}

// RunListTx is RunList in the caller's transaction.
func (c *Client) RunListTx(ctx context.Context, tx pgx.Tx, params *RunListParams) ([]*workflow.Run, error) {
	return runList(ctx, tx, params)
}

func runList(ctx context.Context, q stepwisetype.DBTX, params *RunListParams) ([]*workflow.Run, error) {
	p := RunListParams{}
	if params != nil {
		p = *params
	}
	return wfengine.ListRuns(ctx, q, &wfengine.ListRunsParams{Status: p.Status, Workflow: p.Workflow, Schedule: p.Schedule, KeyPrefix: p.KeyPrefix, Limit: p.Limit})
}

// RunCancelOpts are a person's cancellation of a run.
type RunCancelOpts struct {
	// Actor names who cancels, Reason says why; both required and kept in the audit trail
	// (the 'run.cancel_requested' event's reason reads "cancelled by <Actor>: <Reason>").
	Actor, Reason string
	// ExpectedVersion is the run's Version the person saw: the cancel is refused with an
	// error matching stepwisetype.ErrChanged (a *workflow.RunChangedError) if the run
	// changed status since. 0 cancels whatever the run is doing now: cancelling is safe
	// without it, since it only stops the run cooperatively, keeps every committed step and
	// can be undone with RunResume; a finished run is refused (ErrRunNotCancellable).
	ExpectedVersion int64
}

// RunCancel asks a pending or running run to stop cooperatively and returns the run as it is
// after the request, with the check of what the person saw and the audit. A run that has not
// started ends 'cancelled' at its next claim; a running one has its step's context cancelled
// within about a heartbeat, its open step rolled back; one that sleeps or waits for a retry is
// ended by the next maintenance pass. Committed steps stay committed, and the run's
// unfinished descendants are cancelled with it.
func (c *Client) RunCancel(ctx context.Context, key string, opts *RunCancelOpts) (*workflow.Run, error) {
	var run *workflow.Run
	err := c.inTx(ctx, "RunCancel", func(tx pgx.Tx) error {
		var err error
		run, err = c.RunCancelTx(ctx, tx, key, opts)
		return err
	})
	return run, err
}

// RunCancelTx is RunCancel in the caller's transaction: the request and its event commit with
// tx.
func (c *Client) RunCancelTx(ctx context.Context, tx pgx.Tx, key string, opts *RunCancelOpts) (*workflow.Run, error) {
	if opts == nil {
		return nil, fmt.Errorf("stepwise.Client.RunCancel(%q): opts are nil: pass RunCancelOpts with Actor and Reason", key)
	}
	if err := checkActor(fmt.Sprintf("stepwise.Client.RunCancel(%q)", key), opts.Actor, opts.Reason); err != nil {
		return nil, err
	}
	if opts.ExpectedVersion < 0 {
		return nil, fmt.Errorf("stepwise.Client.RunCancel(%q): ExpectedVersion %d: pass the run's Version as read, or 0 to cancel whatever it is doing now", key, opts.ExpectedVersion)
	}
	// Lock the run row: guards against a worker finishing the run, or an operator resuming
	// it, between the check of what the person saw and the request, which would record a
	// cancellation of a run other than the one the person decided on.
	var (
		status    workflow.RunStatus
		version   int64
		lastError *string
	)
	err := tx.QueryRow(ctx, `SELECT status, version, last_error FROM stepwise_run WHERE key = $1 FOR UPDATE`, key).Scan(&status, &version, &lastError)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, wrapErr(fmt.Errorf("%w: %q", wfengine.ErrRunNotFound, key))
	}
	if err != nil {
		return nil, fmt.Errorf("cancelling run %q: reading it: %w", key, err)
	}
	// Guards against a decision on a stale view: the run finished, or was resumed and is
	// another episode of itself, since the person read it.
	if opts.ExpectedVersion != 0 && version != opts.ExpectedVersion {
		return nil, wrapErr(&workflow.RunChangedError{Key: key, SeenVersion: opts.ExpectedVersion, Status: status, Version: version, LastError: lastError})
	}
	if status.Finished() {
		return nil, fmt.Errorf("%w: run %q is %s (version %d): only a pending or running run can be cancelled; nothing was done", ErrRunNotCancellable, key, status, version)
	}
	if err := wfengine.CancelRun(ctx, tx, key, "cancelled by "+opts.Actor+": "+opts.Reason); err != nil {
		return nil, err
	}
	return c.runGet(ctx, tx, key)
}

// RunResumeOpts are a person's decision to continue a failed or cancelled run.
type RunResumeOpts struct {
	// Actor names who resumes, Reason says why the run can go on now (the incident fixed);
	// both required, recorded in the run's 'run.resume' event.
	Actor, Reason string
	// ExpectedVersion is the run's Version the person saw. Required (1 or more): a run
	// resumed by someone else meanwhile, run and failed again (perhaps for a reason that
	// should not be retried blindly) has another version, and the resume is refused with an
	// error matching stepwisetype.ErrChanged (a *workflow.RunChangedError). Descendants that
	// became failed or cancelled after the run ended (news its version does not show) are
	// left as they are, not resumed with it (RunResumeResult.LeftAsTheyAre). A script that
	// decides on what the run is now reads it (RunGet) and passes that Version.
	ExpectedVersion int64
}

// RunResumeResult is what a resume did.
type RunResumeResult struct {
	// Run is the run as it is after the resume: pending, under a new River job.
	Run *workflow.Run
	// LeftAsTheyAre are the keys of the failed or cancelled descendants the resume did not
	// resume: those that stopped after the run ended (other than by the run's own cancel
	// reaching them), news the person's version did not show, and every run below them. A
	// parent waiting for them sees them as they are and goes on; resume each on its own, at
	// the version you read, if that is the decision. The run's 'run.resume' event lists them
	// too.
	LeftAsTheyAre []string
}

// RunResume continues a failed or cancelled run from its last committed cursor under a new
// River job, only if the run is still at opts.ExpectedVersion, with its failed or cancelled
// descendants except those it leaves as they are (see RunResumeResult). The run's checkpoint
// is left as committed, so no committed step is redone, and the run gets a fresh crash-loop
// budget. A pending, running or succeeded run is refused (workflow.ErrRunNotResumable).
func (c *Client) RunResume(ctx context.Context, key string, opts *RunResumeOpts) (*RunResumeResult, error) {
	var res *RunResumeResult
	err := c.inTx(ctx, "RunResume", func(tx pgx.Tx) error {
		var err error
		res, err = c.RunResumeTx(ctx, tx, key, opts)
		return err
	})
	return res, err
}

// RunResumeTx is RunResume in the caller's transaction: the run's new job and its event
// commit with tx, and nothing of a refused resume remains in it.
func (c *Client) RunResumeTx(ctx context.Context, tx pgx.Tx, key string, opts *RunResumeOpts) (*RunResumeResult, error) {
	what := fmt.Sprintf("stepwise.Client.RunResume(%q)", key)
	switch {
	case opts == nil:
		return nil, fmt.Errorf("%s: opts are nil: pass RunResumeOpts with Actor, Reason and the ExpectedVersion you saw", what)
	case opts.ExpectedVersion < 1:
		return nil, fmt.Errorf("%s: ExpectedVersion %d: pass the run's Version as you read it (1 or more); a resume is never unconditional", what, opts.ExpectedVersion)
	case c == nil || c.river == nil:
		return nil, fmt.Errorf("%s: the client has no River client to insert the run's job: build it with NewClient", what)
	}
	if err := checkActor(what, opts.Actor, opts.Reason); err != nil {
		return nil, err
	}
	left, err := wfengine.ResumeTx(ctx, c.river, tx, key, opts.ExpectedVersion, opts.Actor, opts.Reason)
	if err != nil {
		return nil, wrapErr(err)
	}
	run, err := c.runGet(ctx, tx, key)
	if err != nil {
		return nil, err
	}
	return &RunResumeResult{Run: run, LeftAsTheyAre: left}, nil
}
