package schedule_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/schedule"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// A public caller cannot make a run look like a member of a schedule's slot: StartOpts has
// no field that says so (before this package existed it had Schedule, Slot and Shard, and
// any Start could forge a slot's membership and so its batch status).
func TestStartOptsCannotSetSlot(t *testing.T) {
	t.Parallel()
	typ := reflect.TypeFor[workflow.StartOpts]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		require.NotContains(t, []string{"Schedule", "Slot", "Shard"}, f.Name,
			"workflow.StartOpts.%s lets any caller record a run as a schedule slot's", f.Name)
	}
	var names []string
	for i := range typ.NumField() {
		names = append(names, typ.Field(i).Name)
	}
	// The tracer of the start's span says nothing about the run's membership.
	require.Equal(t, []string{"InsertOpts", "TracerProvider"}, names, "StartOpts carries InsertOpts and TracerProvider only")
}

// A run started by a tick, and one started by StartSlot, still records its schedule, slot
// and shard, through the internal path workflow gives package schedule.
func TestScheduledRunRecordsSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupScheduler(t, testkit.DB(t), nil)
	sch := settleSchedule("rec", "* * * * *", schedule.CatchUpAll{}, schedule.OverlapAllowAll, 2)
	require.NoError(t, schedule.Add(b.sched, sch))
	b.tick(t, "rec")
	slot := t0.Add(time.Minute)
	b.clock.Set(slot)
	require.Equal(t, []time.Time{slot}, b.tick(t, "rec").Materialized)
	for shard := range 2 {
		run, err := workflow.GetRun(ctx, b.pool, schedule.RunKey("rec", slot, shard))
		require.NoError(t, err)
		require.NotNil(t, run.Schedule)
		require.Equal(t, "rec", *run.Schedule)
		require.NotNil(t, run.Slot)
		require.True(t, slot.Equal(*run.Slot), "slot %s, want %s", *run.Slot, slot)
		require.NotNil(t, run.Shard)
		require.Equal(t, shard, *run.Shard)
	}

	// StartSlot: a slot ahead of its tick, started by hand; the tick then starts nothing.
	next := slot.Add(time.Minute)
	var runs []*workflow.Run
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		runs, err = schedule.StartSlot(ctx, b.client, tx, sch, next, "test")
		return err
	}))
	require.Len(t, runs, 2)
	for shard, run := range runs {
		require.True(t, run.Created)
		require.Equal(t, schedule.RunKey("rec", next, shard), run.Key)
		require.Equal(t, "rec", *run.Schedule)
		require.True(t, next.Equal(*run.Slot))
		require.Equal(t, shard, *run.Shard)
	}
	b.clock.Set(next)
	tick := b.tick(t, "rec")
	require.Empty(t, tick.Materialized, "StartSlot decided the slot; the tick passes over it")
	require.Zero(t, tick.RunsStarted, "the runs StartSlot started are the slot's runs")
	require.True(t, next.Equal(tick.Watermark))
	rep, err := operator(t, b.pool).SlotGet(ctx, "rec", next)
	require.NoError(t, err)
	require.Equal(t, "test", rep.DecidedBy)
	requireOneRunPerSlotShard(t, b.pool, "rec")

	// A time that is not a slot of the spec is refused, naming it and a slot to use.
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := schedule.StartSlot(ctx, b.client, tx, sch, next.Add(30*time.Second), "test")
		return err
	})
	require.ErrorIs(t, err, schedule.ErrInvalid)
	require.ErrorContains(t, err, "is not a slot of")
}
