package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// BatchStatus is a slot's status derived from evidence: the runs of its shards and the
// operations those runs enqueued (stepwise_operation.run_key), never from a loop that merely
// returned. See DeriveBatchStatus for the rules.
type BatchStatus string

const (
	// BatchSkipped: the slot was recorded as skipped by the misfire or overlap policy; the
	// slot's Reason says which.
	BatchSkipped BatchStatus = "SKIPPED"

	// BatchBuffered: the slot waits for an earlier slot's runs (OverlapBufferOne,
	// OverlapBufferAll, OverlapCancelOther); no run exists yet.
	BatchBuffered BatchStatus = "BUFFERED"

	// BatchRunning: some shard run is pending or running.
	BatchRunning BatchStatus = "RUNNING"

	// BatchReconciling: every shard run succeeded, but operations they enqueued are not yet
	// terminal (PENDING, PROCESSING, RETRYABLE, UNKNOWN_EXTERNAL): money may still move.
	BatchReconciling BatchStatus = "RECONCILING"

	// BatchNeedsAttention: every shard run succeeded and some operation is MANUAL: only a
	// person can finish the batch (stepwise.Client.OperationResolve). The report's NeedsAttention counts
	// them. Such a slot is not COMPLETED, and not RECONCILING either, since waiting will
	// not finish it.
	BatchNeedsAttention BatchStatus = "NEEDS_ATTENTION"

	// BatchCompleted: every shard run succeeded and every operation they enqueued is
	// terminal (SUCCEEDED or FAILED_PERMANENT). A permanently refused payment is a final,
	// proven outcome, so it does not keep a batch open; the report's Operations counts show
	// it.
	BatchCompleted BatchStatus = "COMPLETED"

	// BatchFailed: some shard run failed, or a shard's run is missing (a run the slot
	// should have and does not is not evidence of anything done).
	BatchFailed BatchStatus = "FAILED"

	// BatchCancelled: some shard run was cancelled (CancelRun, e.g. by OverlapCancelOther)
	// and none failed.
	BatchCancelled BatchStatus = "CANCELLED"
)

// Slot decisions as stored in stepwise_schedule_slot.status.
const (
	SlotMaterialized = "materialized"
	SlotSkipped      = "skipped"
	SlotBuffered     = "buffered"
)

// RunMissing is the key of SlotReport.Runs that counts shards whose run does not exist.
const RunMissing = "missing"

// SlotReport is a slot's decision and its batch status with the evidence behind it.
type SlotReport struct {
	Schedule string
	Slot     time.Time

	// Decision is SlotMaterialized, SlotSkipped or SlotBuffered.
	Decision string
	// Reason is the skip reason code (Reason…), empty unless skipped.
	Reason string
	// Detail says the reason in words (or what a buffered slot waits for, or who started
	// the slot by hand).
	Detail string
	// DecidedBy is who decided the slot: "scheduler" for a tick, the actor given to
	// StartSlot for a slot started by hand.
	DecidedBy string
	// Shards is how many runs the slot fans out to.
	Shards int

	// Runs counts the slot's runs by status (pending, running, succeeded, failed,
	// cancelled; RunMissing for shards without a run).
	Runs map[string]int
	// Operations counts the operations the slot's runs enqueued, by state.
	Operations map[outbox.State]int

	// Status is derived from Decision, Runs and Operations by DeriveBatchStatus.
	Status BatchStatus
	// NeedsAttention counts outbox.StateManual operations.
	NeedsAttention int

	// DecidedAt, MaterializedAt, StartedAt (first claim of a run) and RunsDoneAt (when a
	// tick saw all runs finished) are nil until they happened.
	DecidedAt      time.Time
	MaterializedAt *time.Time
	StartedAt      *time.Time
	RunsDoneAt     *time.Time
}

// DeriveBatchStatus derives a slot's batch status from its decision, its shard count, its
// runs by status and its operations by state. Rules, first match wins:
//
//  1. skipped → SKIPPED; buffered → BUFFERED;
//  2. a run failed, or fewer runs exist than shards → FAILED (final: it cannot complete);
//  3. a run was cancelled → CANCELLED (final too);
//  4. a run is pending or running → RUNNING;
//  5. an operation is MANUAL → NEEDS_ATTENTION;
//  6. an operation is in any state but SUCCEEDED or FAILED_PERMANENT → RECONCILING;
//  7. otherwise → COMPLETED (all runs succeeded, all operations terminal, or none).
//
// An operation state this version does not know keeps a batch open (RECONCILING): only
// outbox.State.Terminal states close it.
func DeriveBatchStatus(decision string, shards int, runs map[string]int, operations map[outbox.State]int) BatchStatus {
	switch decision {
	case SlotSkipped:
		return BatchSkipped
	case SlotBuffered:
		return BatchBuffered
	}
	present := 0
	for status, n := range runs {
		if status != RunMissing {
			present += n
		}
	}
	switch {
	case runs[string(workflow.RunStatusFailed)] > 0 || present < shards || runs[RunMissing] > 0:
		return BatchFailed
	case runs[string(workflow.RunStatusCancelled)] > 0:
		return BatchCancelled
	case runs[string(workflow.RunStatusPending)] > 0 || runs[string(workflow.RunStatusRunning)] > 0:
		return BatchRunning
	case operations[outbox.StateManual] > 0:
		return BatchNeedsAttention
	}
	for state, n := range operations {
		if n > 0 && !state.Terminal() {
			return BatchReconciling
		}
	}
	return BatchCompleted
}

// Info is a schedule's row: its stored definition and progress.
type Info struct {
	Name      string
	Spec      string
	Zone      string
	Gap       string
	Misfire   json.RawMessage
	Overlap   string
	Shards    int
	Watermark time.Time
	Paused    bool
	Version   int
	CreatedAt time.Time
	UpdatedAt time.Time
}

// refuseSlotWithoutRuns returns ErrSlotRunsMissing for a slot that was materialized and has
// fewer runs than it fanned out to. Guards against StartSlot re-running a date whose runs were
// deleted: with the runs gone, their keys no longer stop a second start, and the second run
// would begin from cursor zero and redo what the first committed.
func refuseSlotWithoutRuns(ctx context.Context, q stepwisetype.DBTX, schedule string, slot time.Time) error {
	var shards, runs int
	err := q.QueryRow(ctx, `SELECT s.shards,
			(SELECT count(*) FROM stepwise_run r WHERE r.schedule = s.schedule AND r.slot = s.slot)
		FROM stepwise_schedule_slot s WHERE s.schedule = $1 AND s.slot = $2 AND s.status = 'materialized'`,
		schedule, slot.UTC()).Scan(&shards, &runs)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("reading slot %s of schedule %q: %w", fmtSlot(slot), schedule, err)
	case runs < shards:
		return fmt.Errorf("%w: schedule %q slot %s was materialized with %d runs and %d of them are gone; starting them again "+
			"would redo the slot's work from the start. Find what the slot did in the ledger (operations whose run key starts with %q) "+
			"and settle what is missing by hand", ErrSlotRunsMissing, schedule, fmtSlot(slot), shards, shards-runs, schedule+"/"+slot.UTC().Format(time.RFC3339)+"/")
	}
	return nil
}
