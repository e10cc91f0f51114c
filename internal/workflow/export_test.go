package workflow

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/stepwise-go/stepwise/internal/checkpoint"
)

// DisableFenceForTest removes fencing (token check, fenced write, lost-lease reaction), so
// the fault suite can prove that it catches a build without the fence. Test binaries only.
func DisableFenceForTest(e *Engine) { e.fence = noFence{e.store} }

// noFence is a build that forgot the fence: no token check at begin, and a "fenced" write
// that adopts whatever token is current, so a zombie's commit always lands. It goes through
// the real checkpoint.Advance rather than a copy of its SQL.
type noFence struct{ s *checkpoint.Store }

func (n noFence) Begin(ctx context.Context, _ *checkpoint.Lease) (pgx.Tx, error) {
	return n.s.Pool().Begin(ctx)
}

func (n noFence) Advance(ctx context.Context, tx pgx.Tx, l *checkpoint.Lease, cursor json.RawMessage, opts *checkpoint.AdvanceOpts) error {
	st, err := n.s.Get(ctx, l.Key)
	if err != nil {
		return err
	}
	l.Token = st.Token
	return n.s.Advance(ctx, tx, l, cursor, opts)
}

func (n noFence) AdvanceCommit(ctx context.Context, tx pgx.Tx, l *checkpoint.Lease, cursor json.RawMessage, opts *checkpoint.AdvanceOpts) error {
	st, err := n.s.Get(ctx, l.Key)
	if err != nil {
		return err
	}
	l.Token = st.Token
	return n.s.AdvanceCommit(ctx, tx, l, cursor, opts) // tx is not Begin's: Advance, then COMMIT
}

func (noFence) Enforced() bool { return false }

// MaintenanceInsertOptsForTest are the options the periodic maintenance job is inserted with.
func MaintenanceInsertOptsForTest(e *Engine) *river.InsertOpts { return e.maintenanceInsertOpts() }

// MaintenanceScansForTest are the scans of a maintenance pass with their arguments for an
// engine, for EXPLAIN; the page of running jobs is (afterJob, lastJob].
func MaintenanceScansForTest(e *Engine, afterJob, lastJob int64) map[string][]any {
	return map[string][]any{
		"expired":  {expiredScanSQL, e.cfg.Lease.Milliseconds()},
		"running":  {runningPageSQL, afterJob, sweepPage},
		"unleased": {unleasedScanSQL, e.unleasedGrace().Milliseconds(), afterJob, lastJob},
		"sweep":    {sweepScanSQL, "", sweepPage},
		"cancel":   {cancelScanSQL},
	}
}

// MarkStepErrorForTest records a step error of the run's attempt under jobID, as a worker
// does after rolling a step back (not on the job's last attempt).
func MarkStepErrorForTest(ctx context.Context, e *Engine, key string, jobID int64, msg string, maxFailures int) (RunStatus, error) {
	status, _, err := markStepError(ctx, e.pool, key, stepActor{owner: "test-worker", jobID: jobID}, msg, maxFailures)
	return status, err
}

// MaintenanceArgsForTest is the maintenance job's River args, for tests that insert one by
// hand.
type MaintenanceArgsForTest = maintenanceArgs

// OwnerForTest is the lease owner a worker of the River client clientID claims under for
// attempt of job jobID (what maintenance recognises as the job's own lease).
func OwnerForTest(clientID string, jobID int64, attempt int) string {
	return ownerOf(&rivertype.JobRow{ID: jobID, Attempt: attempt, AttemptedBy: []string{clientID}})
}
