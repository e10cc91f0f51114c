package schedule_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/internal/schedule"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/migrations"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// startByHand starts slot of sch with StartSlot in a transaction of its own.
func (b *schedBundle) startByHand(t testing.TB, sch schedule.Schedule[settleArgs], slot time.Time) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := schedule.StartSlot(ctx, b.client, tx, sch, slot, "alice")
		return err
	}))
}

// TestTickDoesNotRedecideASlotStartedByHand: a slot started by hand ahead of its tick is
// decided; the tick that reaches it must not decide it again by its overlap policy. When
// StartSlot recorded no decision, the tick recorded the slot SKIPPED (overlap_skip: the
// previous slot's runs were unfinished) while the slot's own run ran.
func TestTickDoesNotRedecideASlotStartedByHand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupScheduler(t, testkit.DB(t), nil)
	sch := settleSchedule("hand-ahead", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapSkip, 1)
	require.NoError(t, schedule.Add(b.sched, sch))
	b.tick(t, "hand-ahead")
	s1 := t0.Add(time.Minute)
	b.clock.Set(s1)
	require.Equal(t, []time.Time{s1}, b.tick(t, "hand-ahead").Materialized) // its run stays pending: no workers

	s2 := s1.Add(time.Minute)
	b.startByHand(t, sch, s2)
	b.clock.Set(s2)
	tick := b.tick(t, "hand-ahead")
	require.Empty(t, tick.Skipped, "the tick re-decided the slot started by hand")
	require.Empty(t, tick.Materialized)
	require.True(t, s2.Equal(tick.Watermark), "the watermark passes the slot decided by hand")

	rep, err := operator(t, b.pool).SlotGet(ctx, "hand-ahead", s2)
	require.NoError(t, err)
	require.Equal(t, schedule.SlotMaterialized, rep.Decision)
	require.Equal(t, schedule.BatchRunning, rep.Status, "a slot whose run runs is RUNNING, not %s", rep.Status)
	require.Equal(t, "alice", rep.DecidedBy)
	require.Equal(t, "started by hand by alice", rep.Detail)
	requireOneRunPerSlotShard(t, b.pool, "hand-ahead")
	require.Equal(t, 1, queryInt(t, b.pool, `SELECT count(*) FROM stepwise_event
		WHERE subject = 'schedule:hand-ahead' AND kind = 'schedule.slot_started' AND actor = 'alice' AND from_state IS NULL`))
}

// TestOverlapCountsASlotStartedByHand: a past slot started by hand (before the watermark, so
// no tick will ever reach it) is in flight while its run is unfinished, and the overlap
// policy must count it. When StartSlot recorded nothing, OverlapSkip started the next slot
// beside it: two slots in flight at once.
func TestOverlapCountsASlotStartedByHand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupScheduler(t, testkit.DB(t), nil)
	sch := settleSchedule("hand-past", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapSkip, 1)
	require.NoError(t, schedule.Add(b.sched, sch))
	b.tick(t, "hand-past") // the schedule starts at t0: no back-fill

	past := t0.Add(-time.Hour)
	b.startByHand(t, sch, past)
	s1 := t0.Add(time.Minute)
	b.clock.Set(s1)
	tick := b.tick(t, "hand-past")
	require.Empty(t, tick.Materialized, "OverlapSkip started slot %s while the slot started by hand was unfinished", s1)
	require.Len(t, tick.Skipped, 1)
	require.Equal(t, schedule.ReasonOverlapSkip, tick.Skipped[0].Reason)

	rep, err := operator(t, b.pool).SlotGet(ctx, "hand-past", s1)
	require.NoError(t, err)
	require.Equal(t, schedule.BatchSkipped, rep.Status)
	require.Contains(t, rep.Detail, past.Format(time.RFC3339))
}

// TestSlotStatusOfAPastSlotStartedByHand: a past date started by hand has a slot status at
// once, without Schedule.StartAt and without a tick. When StartSlot recorded nothing, no tick
// ever reached a slot before the watermark, and SlotStatus said ErrSlotNotFound forever (the
// console: "no slot decided yet").
func TestSlotStatusOfAPastSlotStartedByHand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupScheduler(t, testkit.DB(t), nil)
	sch := settleSchedule("hand-status", "0 7 * * *", schedule.CatchUpAll{}, schedule.OverlapAllowAll, 2)
	require.NoError(t, schedule.Add(b.sched, sch))
	b.tick(t, "hand-status")

	past := time.Date(2026, 3, 20, 7, 0, 0, 0, time.UTC)
	b.startByHand(t, sch, past)
	b.clock.Set(t0.Add(time.Hour))
	b.tick(t, "hand-status")

	rep, err := operator(t, b.pool).SlotGet(ctx, "hand-status", past)
	require.NoError(t, err, "a slot started by hand has a status")
	require.Equal(t, schedule.SlotMaterialized, rep.Decision)
	require.Equal(t, schedule.BatchRunning, rep.Status)
	require.Equal(t, 2, rep.Runs["pending"])
	require.Equal(t, "alice", rep.DecidedBy)
	slots, err := operator(t, b.pool).SlotList(ctx, "hand-status", &stepwise.SlotListParams{Limit: 10})
	require.NoError(t, err)
	require.Len(t, slots, 1)
	require.True(t, past.Equal(slots[0].Slot))
}

// TestStartSlotOfASkippedSlot: an operator starts by hand a slot the tick skipped. Its runs
// run, so it is materialized now (decided by the operator), and its detail keeps what it was.
func TestStartSlotOfASkippedSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupScheduler(t, testkit.DB(t), nil)
	sch := settleSchedule("hand-skipped", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapSkip, 1)
	require.NoError(t, schedule.Add(b.sched, sch))
	b.tick(t, "hand-skipped")
	s1, s2 := t0.Add(time.Minute), t0.Add(2*time.Minute)
	b.clock.Set(s1)
	b.tick(t, "hand-skipped")
	b.clock.Set(s2)
	require.Len(t, b.tick(t, "hand-skipped").Skipped, 1)

	b.startByHand(t, sch, s2)
	b.startByHand(t, sch, s2) // again: changes nothing
	rep, err := operator(t, b.pool).SlotGet(ctx, "hand-skipped", s2)
	require.NoError(t, err)
	require.Equal(t, schedule.SlotMaterialized, rep.Decision)
	require.Equal(t, schedule.BatchRunning, rep.Status)
	require.Empty(t, rep.Reason)
	require.Equal(t, "alice", rep.DecidedBy)
	require.Contains(t, rep.Detail, "was skipped (overlap_skip: runs of slot "+s1.Format(time.RFC3339))
	require.Contains(t, rep.Detail, "; started by hand by alice")
	require.Equal(t, 1, queryInt(t, b.pool, `SELECT count(*) FROM stepwise_event
		WHERE subject = 'schedule:hand-skipped' AND kind = 'schedule.slot_started' AND from_state = 'skipped' AND actor = 'alice'`))
	requireOneRunPerSlotShard(t, b.pool, "hand-skipped")

	// The slot started by hand is in flight: the next slot is skipped under OverlapSkip
	// (and so would it be for s1's run alone; both are unfinished).
	b.clock.Set(s2.Add(time.Minute))
	tick := b.tick(t, "hand-skipped")
	require.Empty(t, tick.Materialized)
	require.Len(t, tick.Skipped, 1)
}

// TestStartSlotBeforeTheScheduleHasARow: StartSlot in a process without a Scheduler, before
// any tick created the schedule's row. The slot is recorded; the first tick then creates the
// row at its own time (no back-fill since the slot started by hand) and passes over the slot
// when it is due.
func TestStartSlotBeforeTheScheduleHasARow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupScheduler(t, testkit.DB(t), nil)
	sch := settleSchedule("hand-first", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapAllowAll, 1)
	ahead := t0.Add(3 * time.Minute)
	b.startByHand(t, sch, t0.Add(-time.Hour))
	b.startByHand(t, sch, ahead)
	_, err := operator(t, b.pool).ScheduleGet(ctx, "hand-first")
	require.ErrorIs(t, err, schedule.ErrNotFound, "StartSlot does not create the schedule's row")
	// An operator sees the slots started by hand before the first tick: the schedule has no
	// row yet, but it has slots. A name with neither is unknown.
	slots, err := operator(t, b.pool).SlotList(ctx, "hand-first", nil)
	require.NoError(t, err, "the slots started by hand are listed before the schedule's first tick")
	require.Len(t, slots, 2)
	require.True(t, slots[0].Slot.Equal(ahead), "newest first")
	_, err = operator(t, b.pool).SlotList(ctx, "no-such-schedule", nil)
	require.ErrorIs(t, err, stepwisetype.ErrNotFound)

	require.NoError(t, schedule.Add(b.sched, sch))
	b.clock.Set(t0.Add(time.Minute))
	first := b.tick(t, "hand-first")
	require.True(t, first.Created)
	require.Empty(t, first.Materialized, "the first tick starts at its own time: no back-fill")
	b.clock.Set(ahead)
	tick := b.tick(t, "hand-first")
	require.Equal(t, []time.Time{t0.Add(2 * time.Minute)}, tick.Materialized, "the slot started by hand is passed over")
	require.True(t, ahead.Equal(tick.Watermark))
	slots, err = operator(t, b.pool).SlotList(ctx, "hand-first", &stepwise.SlotListParams{Limit: 10})
	require.NoError(t, err)
	require.Len(t, slots, 3)
	by := map[string]int{}
	for _, s := range slots {
		by[s.DecidedBy]++
	}
	require.Equal(t, map[string]int{"alice": 2, "scheduler": 1}, by)
	requireOneRunPerSlotShard(t, b.pool, "hand-first")
}

// TestStartSlotNamesWhoStartsIt: the actor is required.
func TestStartSlotNamesWhoStartsIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupScheduler(t, testkit.DB(t), nil)
	sch := settleSchedule("hand-actor", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapAllowAll, 1)
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := schedule.StartSlot(ctx, b.client, tx, sch, t0, "")
		return err
	})
	require.ErrorIs(t, err, schedule.ErrInvalid)
	require.ErrorContains(t, err, "actor is empty")
}

// TestTickPassesOverAScheduleWhileStartSlotHoldsIt: a tick that runs while a StartSlot's
// transaction is open passes over the schedule (Locked) rather than planning without the
// slot being started; the next tick sees it.
func TestTickPassesOverAScheduleWhileStartSlotHoldsIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupScheduler(t, testkit.DB(t), nil)
	sch := settleSchedule("hand-lock", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapSkip, 1)
	require.NoError(t, schedule.Add(b.sched, sch))
	b.tick(t, "hand-lock")

	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = schedule.StartSlot(ctx, b.client, tx, sch, t0.Add(-time.Hour), "alice")
	require.NoError(t, err)
	s1 := t0.Add(time.Minute)
	b.clock.Set(s1)
	require.True(t, b.tick(t, "hand-lock").Locked)
	require.NoError(t, tx.Commit(ctx))
	tick := b.tick(t, "hand-lock")
	require.Empty(t, tick.Materialized, "OverlapSkip counts the slot started by hand")
	require.Len(t, tick.Skipped, 1)
}

// TestMigration008RecordsSlotsStartedByHandBefore: slots started by hand before StartSlot
// recorded decisions have runs and no row. Migration 008 records those a tick may still reach
// (after the watermark) or whose runs are unfinished, so no tick decides them again; a past
// slot whose runs all finished is left alone (its row may have been pruned).
func TestMigration008RecordsSlotsStartedByHandBefore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupScheduler(t, testkit.DB(t), nil)
	sch := settleSchedule("hand-old", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapSkip, 2)
	require.NoError(t, schedule.Add(b.sched, sch))
	b.tick(t, "hand-old")
	unfinished, finished, ahead := t0.Add(-time.Hour), t0.Add(-2*time.Hour), t0.Add(5*time.Minute)
	for _, s := range []time.Time{unfinished, finished, ahead} {
		b.startByHand(t, sch, s)
	}
	_, err := b.pool.Exec(ctx, `UPDATE stepwise_run SET status = 'succeeded', finished_at = now() WHERE schedule = 'hand-old' AND slot = $1`, finished)
	require.NoError(t, err)
	// As before migration 008: the runs, no slot rows.
	_, err = b.pool.Exec(ctx, `DELETE FROM stepwise_schedule_slot WHERE schedule = 'hand-old'`)
	require.NoError(t, err)

	all, err := migrations.All()
	require.NoError(t, err)
	var backfill string
	for _, m := range all {
		if m.Version == 8 {
			for _, stmt := range strings.Split(m.SQL, ";\n") {
				if i := strings.Index(stmt, "INSERT INTO stepwise_schedule_slot"); i >= 0 {
					backfill = stmt[i:]
				}
			}
		}
	}
	require.NotEmpty(t, backfill, "migration 008 records slots started by hand")
	_, err = b.pool.Exec(ctx, backfill)
	require.NoError(t, err)

	slots, err := operator(t, b.pool).SlotList(ctx, "hand-old", &stepwise.SlotListParams{Limit: 10})
	require.NoError(t, err)
	require.Len(t, slots, 2)
	require.True(t, ahead.Equal(slots[0].Slot))
	require.True(t, unfinished.Equal(slots[1].Slot))
	for _, s := range slots {
		require.Equal(t, schedule.SlotMaterialized, s.Decision)
		require.Equal(t, "unknown", s.DecidedBy)
		require.Equal(t, 2, s.Shards)
		require.Equal(t, schedule.BatchRunning, s.Status)
	}
	// The tick now counts the unfinished slot and passes over the one ahead.
	b.clock.Set(ahead)
	tick := b.tick(t, "hand-old")
	require.Empty(t, tick.Materialized)
	require.Len(t, tick.Skipped, 4, "the four slots before the one started by hand, skipped for overlap")
	for _, sk := range tick.Skipped {
		require.False(t, sk.Slot.Equal(ahead))
	}
}
