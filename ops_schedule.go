package stepwise

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// ScheduleGet reads a schedule's stored definition and progress (a schedule has a row from
// its first tick on). Replaces schedule.Get.
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
	info, err := schedule.Get(ctx, q, name)
	return info, wrapErr(err)
}

// ScheduleList reads every schedule's stored definition and progress, by name (a schedule has
// a row from its first tick on). Replaces the console's and the command's own queries.
func (c *Client) ScheduleList(ctx context.Context) ([]*schedule.Info, error) {
	if err := c.checkPool("ScheduleList"); err != nil {
		return nil, err
	}
	return schedule.List(ctx, c.pool)
}

// ScheduleListTx is ScheduleList in the caller's transaction.
func (c *Client) ScheduleListTx(ctx context.Context, tx pgx.Tx) ([]*schedule.Info, error) {
	return schedule.List(ctx, tx)
}

// SchedulePauseOpts are a person's pause or resume of a schedule (SchedulePause,
// ScheduleResume), as River's QueuePauseOpts serve QueuePause and QueueResume.
type SchedulePauseOpts struct {
	// Actor names who acts, Reason says why; both required, recorded in the
	// 'schedule.paused' or 'schedule.resumed' event.
	Actor, Reason string
}

// SchedulePause stops ticks from deciding the schedule's slots (runs already started go on);
// see schedule.Pause for what happens at resume. Pausing a paused schedule does nothing and
// records nothing. Replaces schedule.Pause.
func (c *Client) SchedulePause(ctx context.Context, name string, opts *SchedulePauseOpts) error {
	return c.inTx(ctx, "SchedulePause", func(tx pgx.Tx) error { return c.SchedulePauseTx(ctx, tx, name, opts) })
}

// SchedulePauseTx is SchedulePause in the caller's transaction.
func (c *Client) SchedulePauseTx(ctx context.Context, tx pgx.Tx, name string, opts *SchedulePauseOpts) error {
	return setPaused(ctx, tx, name, true, opts)
}

// ScheduleResume lets a paused schedule's ticks decide slots again: the slots that fell due
// meanwhile are decided by its misfire policy. Resuming an active schedule does nothing.
// Replaces schedule.Resume.
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
	var err error
	if pause {
		err = schedule.Pause(ctx, tx, name, opts.Actor, opts.Reason)
	} else {
		err = schedule.Resume(ctx, tx, name, opts.Actor, opts.Reason)
	}
	return wrapErr(err)
}

// SlotListParams selects a schedule's slots for SlotList.
type SlotListParams struct {
	// Limit is how many of the newest slots: 0 for 100.
	Limit int
}

// SlotList reports a schedule's newest slots, newest first, each with its decision, its runs
// and operations counted by status and its derived batch status. A schedule without a row
// (never ticked) is an error matching stepwisetype.ErrNotFound. Replaces schedule.ListSlots.
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
	// A schedule that does not exist is said so, not reported as one without slots.
	if _, err := scheduleGet(ctx, q, name); err != nil {
		return nil, err
	}
	return schedule.ListSlots(ctx, q, name, limit)
}

// SlotGet reports one slot of a schedule as SlotList does; a slot no tick nor StartSlot has
// decided is an error matching stepwisetype.ErrNotFound. Replaces schedule.SlotStatus.
func (c *Client) SlotGet(ctx context.Context, scheduleName string, slot time.Time) (*schedule.SlotReport, error) {
	if err := c.checkPool("SlotGet"); err != nil {
		return nil, err
	}
	r, err := schedule.SlotStatus(ctx, c.pool, scheduleName, slot)
	return r, wrapErr(err)
}

// SlotGetTx is SlotGet in the caller's transaction.
func (c *Client) SlotGetTx(ctx context.Context, tx pgx.Tx, scheduleName string, slot time.Time) (*schedule.SlotReport, error) {
	r, err := schedule.SlotStatus(ctx, tx, scheduleName, slot)
	return r, wrapErr(err)
}
