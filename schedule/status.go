package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/stepwisetype"
	"github.com/stepwise-go/stepwise/workflow"
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
	// person can finish the batch (reconcile.Resolve). The report's NeedsAttention counts
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

// SlotStatus reports one slot of a schedule: its decision, its runs and operations counted
// by status, and its derived batch status. A slot neither a tick nor StartSlot has decided is
// ErrSlotNotFound.
func SlotStatus(ctx context.Context, q stepwisetype.DBTX, schedule string, slot time.Time) (*SlotReport, error) {
	reports, err := slotReports(ctx, q, schedule, `schedule = $1 AND slot = $2`, slot.UTC())
	if err != nil {
		return nil, err
	}
	if len(reports) == 0 {
		return nil, fmt.Errorf("%w: schedule %q, slot %s", ErrSlotNotFound, schedule, fmtSlot(slot))
	}
	return reports[0], nil
}

// ListSlots reports the newest limit slots of a schedule, newest first, as SlotStatus does
// for one. A limit below 1 means 100. It reads three statements however many slots there
// are, so a report of a month of daily slots costs the same as one of a day.
func ListSlots(ctx context.Context, q stepwisetype.DBTX, schedule string, limit int) ([]*SlotReport, error) {
	if limit < 1 {
		limit = 100
	}
	return slotReports(ctx, q, schedule, `schedule = $1 ORDER BY slot DESC LIMIT $2`, limit)
}

func slotReports(ctx context.Context, q stepwisetype.DBTX, schedule, where string, arg any) ([]*SlotReport, error) {
	rows, err := q.Query(ctx, `SELECT slot, status, coalesce(reason, ''), coalesce(detail, ''), decided_by, shards,
			created_at, materialized_at, started_at, runs_done_at
		FROM stepwise_schedule_slot WHERE `+where, schedule, arg)
	if err != nil {
		return nil, fmt.Errorf("reading slots of schedule %q: %w", schedule, err)
	}
	reports, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*SlotReport, error) {
		r := &SlotReport{Schedule: schedule, Runs: map[string]int{}, Operations: map[outbox.State]int{}}
		err := row.Scan(&r.Slot, &r.Decision, &r.Reason, &r.Detail, &r.DecidedBy, &r.Shards, &r.DecidedAt, &r.MaterializedAt, &r.StartedAt, &r.RunsDoneAt)
		r.Slot = r.Slot.UTC()
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading slots of schedule %q: %w", schedule, err)
	}
	if len(reports) == 0 {
		return nil, nil
	}
	bySlot := map[time.Time]*SlotReport{}
	slots := make([]time.Time, 0, len(reports))
	for _, r := range reports {
		bySlot[r.Slot] = r
		slots = append(slots, r.Slot)
	}
	count := func(what, sql string, into func(r *SlotReport, key string, n int)) error {
		rows, err := q.Query(ctx, sql, schedule, slots)
		if err != nil {
			return fmt.Errorf("counting %s of schedule %q: %w", what, schedule, err)
		}
		var slot time.Time
		var key string
		var n int
		_, err = pgx.ForEachRow(rows, []any{&slot, &key, &n}, func() error {
			if r := bySlot[slot.UTC()]; r != nil {
				into(r, key, n)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("counting %s of schedule %q: %w", what, schedule, err)
		}
		return nil
	}
	if err := count("runs", `SELECT slot, status, count(*)::int FROM stepwise_run
			WHERE schedule = $1 AND slot = ANY($2) GROUP BY slot, status`,
		func(r *SlotReport, status string, n int) { r.Runs[status] += n }); err != nil {
		return nil, err
	}
	// Operations reach their slot through the run that enqueued them; a slot whose runs
	// enqueued none simply has no rows here.
	if err := count("operations", `SELECT r.slot, o.state, count(*)::int
			FROM stepwise_run r JOIN stepwise_operation o ON o.run_key = r.key
			WHERE r.schedule = $1 AND r.slot = ANY($2) GROUP BY r.slot, o.state`,
		func(r *SlotReport, state string, n int) { r.Operations[outbox.State(state)] += n }); err != nil {
		return nil, err
	}
	for _, r := range reports {
		if r.Decision == SlotMaterialized {
			present := 0
			for _, n := range r.Runs {
				present += n
			}
			if present < r.Shards {
				r.Runs[RunMissing] = r.Shards - present
			}
		}
		r.NeedsAttention = r.Operations[outbox.StateManual]
		r.Status = DeriveBatchStatus(r.Decision, r.Shards, r.Runs, r.Operations)
	}
	return reports, nil
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

// Get reads a schedule's row. A schedule registered in code has a row from its first
// tick on; before that it is ErrNotFound.
func Get(ctx context.Context, q stepwisetype.DBTX, name string) (*Info, error) {
	s, err := scanInfo(q.QueryRow(ctx, `SELECT `+infoColumns+` FROM stepwise_schedule WHERE name = $1`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading schedule %q: %w", name, err)
	}
	return s, nil
}

// List reads every schedule's row, by name.
func List(ctx context.Context, q stepwisetype.DBTX) ([]*Info, error) {
	rows, err := q.Query(ctx, `SELECT `+infoColumns+` FROM stepwise_schedule ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("listing schedules: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Info, error) { return scanInfo(r) })
	if err != nil {
		return nil, fmt.Errorf("listing schedules: %w", err)
	}
	return list, nil
}

const infoColumns = `name, spec, zone, gap, misfire, overlap, shards, watermark, paused, version, created_at, updated_at`

func scanInfo(row pgx.Row) (*Info, error) {
	s := &Info{}
	if err := row.Scan(&s.Name, &s.Spec, &s.Zone, &s.Gap, &s.Misfire, &s.Overlap, &s.Shards, &s.Watermark, &s.Paused, &s.Version, &s.CreatedAt, &s.UpdatedAt); err != nil {
		return nil, err
	}
	s.Watermark = s.Watermark.UTC()
	return s, nil
}

// Pause stops ticks from deciding the schedule's slots; the watermark stays where it
// is. Runs already started go on. When resumed, the slots that fell due meanwhile are
// misfires: the schedule's misfire policy decides them as after any outage (so pause a
// CatchUpAll schedule only if catching up afterwards is what you want). It waits for a tick
// holding the schedule to finish, and is audited as 'schedule.paused' with actor and reason.
// Pausing a paused schedule does nothing.
func Pause(ctx context.Context, q stepwisetype.DBTX, name, actor, reason string) error {
	return setPaused(ctx, q, name, true, actor, reason)
}

// Resume undoes Pause, audited as 'schedule.resumed'.
func Resume(ctx context.Context, q stepwisetype.DBTX, name, actor, reason string) error {
	return setPaused(ctx, q, name, false, actor, reason)
}

func setPaused(ctx context.Context, q stepwisetype.DBTX, name string, paused bool, actor, reason string) error {
	kind, from, to := "schedule.paused", "active", "paused"
	if !paused {
		kind, from, to = "schedule.resumed", "paused", "active"
	}
	var found bool
	err := q.QueryRow(ctx, `
		WITH s AS (
			SELECT name FROM stepwise_schedule WHERE name = $1 FOR UPDATE
		), u AS (
			UPDATE stepwise_schedule SET paused = $2, updated_at = now()
			 WHERE name = $1 AND paused <> $2 RETURNING name, watermark
		), ev AS (
			INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, detail)
			SELECT 'schedule:' || name, $3, $4, $5, $6, jsonb_build_object('reason', $7::text, 'watermark', watermark) FROM u
		)
		SELECT EXISTS (SELECT 1 FROM s)`, name, paused, kind, from, to, actor, reason).Scan(&found)
	if err != nil {
		return fmt.Errorf("setting schedule %q paused=%t: %w", name, paused, err)
	}
	if !found {
		return fmt.Errorf("%w: %q (a schedule gets its row at its first tick)", ErrNotFound, name)
	}
	return nil
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
