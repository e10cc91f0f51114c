package stepwise

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/outbox"
	schedengine "github.com/stepwise-go/stepwise/internal/schedule"
	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// ScheduleGet reads a schedule's stored definition and progress (a schedule has a row from
// its first tick on).
func (c *Client) ScheduleGet(ctx context.Context, name string) (*schedule.Info, error) {
	if err := c.checkPool("ScheduleGet"); err != nil {
		return nil, err
	}
	return scheduleGet(ctx, c.pool, name)
}

// ScheduleGetTx is ScheduleGet in the caller's transaction.
func (c *Client) ScheduleGetTx(ctx context.Context, tx pgx.Tx, name string) (*schedule.Info, error) {
	return scheduleGet(ctx, tx, name)
}

func scheduleGet(ctx context.Context, q stepwisetype.DBTX, name string) (*schedule.Info, error) {
	s, err := scanScheduleInfo(q.QueryRow(ctx, `SELECT `+scheduleInfoColumns+` FROM stepwise_schedule WHERE name = $1`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, wrapErr(fmt.Errorf("%w: %q (a schedule gets its row at its first tick)", schedengine.ErrNotFound, name))
	}
	if err != nil {
		return nil, fmt.Errorf("reading schedule %q: %w", name, err)
	}
	return s, nil
}

func scheduleList(ctx context.Context, q stepwisetype.DBTX) ([]*schedule.Info, error) {
	rows, err := q.Query(ctx, `SELECT `+scheduleInfoColumns+` FROM stepwise_schedule ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("listing schedules: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*schedule.Info, error) { return scanScheduleInfo(r) })
	if err != nil {
		return nil, fmt.Errorf("listing schedules: %w", err)
	}
	return list, nil
}

const scheduleInfoColumns = `name, spec, zone, gap, misfire, overlap, shards, watermark, paused, version, created_at, updated_at`

func scanScheduleInfo(row pgx.Row) (*schedule.Info, error) {
	s := &schedule.Info{}
	if err := row.Scan(&s.Name, &s.Spec, &s.Zone, &s.Gap, &s.Misfire, &s.Overlap, &s.Shards, &s.Watermark, &s.Paused, &s.Version, &s.CreatedAt, &s.UpdatedAt); err != nil {
		return nil, err
	}
	s.Watermark = s.Watermark.UTC()
	return s, nil
}

// ScheduleList reads every schedule's stored definition and progress, by name (a schedule has
// a row from its first tick on). Replaces the console's and the command's own queries.
func (c *Client) ScheduleList(ctx context.Context) ([]*schedule.Info, error) {
	if err := c.checkPool("ScheduleList"); err != nil {
		return nil, err
	}
	return scheduleList(ctx, c.pool)
}

// ScheduleListTx is ScheduleList in the caller's transaction.
func (c *Client) ScheduleListTx(ctx context.Context, tx pgx.Tx) ([]*schedule.Info, error) {
	return scheduleList(ctx, tx)
}

// SchedulePauseOpts are a person's pause or resume of a schedule (SchedulePause,
// ScheduleResume), as River's QueuePauseOpts serve QueuePause and QueueResume.
type SchedulePauseOpts struct {
	// Actor names who acts, Reason says why; both required, recorded in the
	// 'schedule.paused' or 'schedule.resumed' event.
	Actor, Reason string
}

// SchedulePause stops ticks from deciding the schedule's slots (runs already started go on);
// the watermark stays where it is. When resumed, the slots that fell due meanwhile are
// misfires: the schedule's misfire policy decides them as after any outage (so pause a
// CatchUpAll schedule only if catching up afterwards is what you want). It waits for a tick
// holding the schedule to finish, and is audited as 'schedule.paused' with the actor and
// reason. Pausing a paused schedule does nothing and records nothing.
func (c *Client) SchedulePause(ctx context.Context, name string, opts *SchedulePauseOpts) error {
	return c.inTx(ctx, "SchedulePause", func(tx pgx.Tx) error { return c.SchedulePauseTx(ctx, tx, name, opts) })
}

// SchedulePauseTx is SchedulePause in the caller's transaction.
func (c *Client) SchedulePauseTx(ctx context.Context, tx pgx.Tx, name string, opts *SchedulePauseOpts) error {
	return setPaused(ctx, tx, name, true, opts)
}

// ScheduleResume lets a paused schedule's ticks decide slots again: the slots that fell due
// meanwhile are decided by its misfire policy. Resuming an active schedule does nothing.
// Audited as 'schedule.resumed'.
func (c *Client) ScheduleResume(ctx context.Context, name string, opts *SchedulePauseOpts) error {
	return c.inTx(ctx, "ScheduleResume", func(tx pgx.Tx) error { return c.ScheduleResumeTx(ctx, tx, name, opts) })
}

// ScheduleResumeTx is ScheduleResume in the caller's transaction.
func (c *Client) ScheduleResumeTx(ctx context.Context, tx pgx.Tx, name string, opts *SchedulePauseOpts) error {
	return setPaused(ctx, tx, name, false, opts)
}

func setPaused(ctx context.Context, tx pgx.Tx, name string, pause bool, opts *SchedulePauseOpts) error {
	what := fmt.Sprintf("stepwise.Client.ScheduleResume(%q)", name)
	if pause {
		what = fmt.Sprintf("stepwise.Client.SchedulePause(%q)", name)
	}
	if opts == nil {
		return fmt.Errorf("%s: opts are nil: pass SchedulePauseOpts with Actor and Reason", what)
	}
	if err := checkActor(what, opts.Actor, opts.Reason); err != nil {
		return err
	}
	kind, from, to := "schedule.paused", "active", "paused"
	if !pause {
		kind, from, to = "schedule.resumed", "paused", "active"
	}
	// FOR UPDATE waits for a tick that holds the schedule's row (the tick locks it while it
	// decides and starts slots). Guards against: a pause that returns while a tick that read
	// the schedule as active is still starting a slot's runs, so that runs begin after the
	// person was told the schedule is paused. The event is written only when the flag changes,
	// in the same statement: the audit trail cannot disagree with the row.
	var found bool
	err := tx.QueryRow(ctx, `
		WITH s AS (
			SELECT name FROM stepwise_schedule WHERE name = $1 FOR UPDATE
		), u AS (
			UPDATE stepwise_schedule SET paused = $2, updated_at = now()
			 WHERE name = $1 AND paused <> $2 RETURNING name, watermark
		), ev AS (
			INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, detail)
			SELECT 'schedule:' || name, $3, $4, $5, $6, jsonb_build_object('reason', $7::text, 'watermark', watermark) FROM u
		)
		SELECT EXISTS (SELECT 1 FROM s)`, name, pause, kind, from, to, opts.Actor, opts.Reason).Scan(&found)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if !found {
		return wrapErr(fmt.Errorf("%s: %w: %q (a schedule gets its row at its first tick)", what, schedengine.ErrNotFound, name))
	}
	return nil
}

// SlotListParams selects a schedule's slots for SlotList.
type SlotListParams struct {
	// Limit is how many of the newest slots: 0 for 100.
	Limit int
}

// SlotList reports a schedule's newest slots, newest first, each with its decision, its runs
// and operations counted by status and its derived batch status. A schedule with neither a
// row (it has never ticked) nor a slot started by hand is an error matching
// stepwisetype.ErrNotFound. It reads three statements however many slots there are, so a
// report of a month of daily slots costs the same as one of a day.
func (c *Client) SlotList(ctx context.Context, scheduleName string, params *SlotListParams) ([]*schedule.SlotReport, error) {
	if err := c.checkPool("SlotList"); err != nil {
		return nil, err
	}
	return slotList(ctx, c.pool, scheduleName, params)
}

// SlotListTx is SlotList in the caller's transaction.
func (c *Client) SlotListTx(ctx context.Context, tx pgx.Tx, scheduleName string, params *SlotListParams) ([]*schedule.SlotReport, error) {
	return slotList(ctx, tx, scheduleName, params)
}

func slotList(ctx context.Context, q stepwisetype.DBTX, name string, params *SlotListParams) ([]*schedule.SlotReport, error) {
	limit := 0
	if params != nil {
		limit = params.Limit
	}
	if limit < 0 {
		return nil, fmt.Errorf("stepwise.Client.SlotList(%q): Limit %d: want 1 or more, or 0 for 100", name, limit)
	}
	if limit == 0 {
		limit = 100
	}
	reports, err := slotReports(ctx, q, name, `schedule = $1 ORDER BY slot DESC LIMIT $2`, limit)
	if err != nil || len(reports) > 0 {
		return reports, err
	}
	// A schedule that does not exist is said so, not reported as one without slots. (A slot
	// started by hand, StartSlot, before the schedule's first tick is listed: it has slots.)
	if _, err := scheduleGet(ctx, q, name); err != nil {
		return nil, err
	}
	return nil, nil
}

// SlotGet reports one slot of a schedule as SlotList does; a slot no tick nor StartSlot has
// decided is an error matching stepwisetype.ErrNotFound (its message names the schedule and the slot).
func (c *Client) SlotGet(ctx context.Context, scheduleName string, slot time.Time) (*schedule.SlotReport, error) {
	if err := c.checkPool("SlotGet"); err != nil {
		return nil, err
	}
	return slotGet(ctx, c.pool, scheduleName, slot)
}

// SlotGetTx is SlotGet in the caller's transaction.
func (c *Client) SlotGetTx(ctx context.Context, tx pgx.Tx, scheduleName string, slot time.Time) (*schedule.SlotReport, error) {
	return slotGet(ctx, tx, scheduleName, slot)
}

func slotGet(ctx context.Context, q stepwisetype.DBTX, name string, slot time.Time) (*schedule.SlotReport, error) {
	reports, err := slotReports(ctx, q, name, `schedule = $1 AND slot = $2`, slot.UTC())
	if err != nil {
		return nil, err
	}
	if len(reports) == 0 {
		return nil, wrapErr(fmt.Errorf("%w: schedule %q, slot %s", schedengine.ErrSlotNotFound, name, slot.UTC().Format(time.RFC3339)))
	}
	return reports[0], nil
}

// slotReports reads the slots of a schedule that where selects, then counts their runs by
// status and the operations those runs enqueued by state, in one statement each, and derives
// each slot's batch status (schedule.DeriveBatchStatus).
func slotReports(ctx context.Context, q stepwisetype.DBTX, name, where string, arg any) ([]*schedule.SlotReport, error) {
	rows, err := q.Query(ctx, `SELECT slot, status, coalesce(reason, ''), coalesce(detail, ''), decided_by, shards,
			created_at, materialized_at, started_at, runs_done_at
		FROM stepwise_schedule_slot WHERE `+where, name, arg)
	if err != nil {
		return nil, fmt.Errorf("reading slots of schedule %q: %w", name, err)
	}
	reports, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*schedule.SlotReport, error) {
		r := &schedule.SlotReport{Schedule: name, Runs: map[string]int{}, Operations: map[outbox.State]int{}}
		err := row.Scan(&r.Slot, &r.Decision, &r.Reason, &r.Detail, &r.DecidedBy, &r.Shards, &r.DecidedAt, &r.MaterializedAt, &r.StartedAt, &r.RunsDoneAt)
		r.Slot = r.Slot.UTC()
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading slots of schedule %q: %w", name, err)
	}
	if len(reports) == 0 {
		return nil, nil
	}
	bySlot := map[time.Time]*schedule.SlotReport{}
	slots := make([]time.Time, 0, len(reports))
	for _, r := range reports {
		bySlot[r.Slot] = r
		slots = append(slots, r.Slot)
	}
	count := func(what, sql string, into func(r *schedule.SlotReport, key string, n int)) error {
		rows, err := q.Query(ctx, sql, name, slots)
		if err != nil {
			return fmt.Errorf("counting %s of schedule %q: %w", what, name, err)
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
			return fmt.Errorf("counting %s of schedule %q: %w", what, name, err)
		}
		return nil
	}
	if err := count("runs", `SELECT slot, status, count(*)::int FROM stepwise_run
			WHERE schedule = $1 AND slot = ANY($2) GROUP BY slot, status`,
		func(r *schedule.SlotReport, status string, n int) { r.Runs[status] += n }); err != nil {
		return nil, err
	}
	// Operations reach their slot through the run that enqueued them; a slot whose runs
	// enqueued none simply has no rows here.
	if err := count("operations", `SELECT r.slot, o.state, count(*)::int
			FROM stepwise_run r JOIN stepwise_operation o ON o.run_key = r.key
			WHERE r.schedule = $1 AND r.slot = ANY($2) GROUP BY r.slot, o.state`,
		func(r *schedule.SlotReport, state string, n int) { r.Operations[outbox.State(state)] += n }); err != nil {
		return nil, err
	}
	for _, r := range reports {
		if r.Decision == schedule.SlotMaterialized {
			present := 0
			for _, n := range r.Runs {
				present += n
			}
			if present < r.Shards {
				r.Runs[schedule.RunMissing] = r.Shards - present
			}
		}
		r.NeedsAttention = r.Operations[outbox.StateManual]
		r.Status = schedule.DeriveBatchStatus(r.Decision, r.Shards, r.Runs, r.Operations)
	}
	return reports, nil
}
