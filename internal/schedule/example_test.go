package schedule_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/internal/schedule"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// DailySettleArgs is the input of one shard of a daily settlement.
type DailySettleArgs struct {
	Date  string `json:"date"` // the business date, in the schedule's zone
	Shard int    `json:"shard"`
}

func (DailySettleArgs) Kind() string { return "example_daily_settle" }

// A daily settlement at 02:30 New York time, in 2 shards, that was down for two days: its
// first tick catches up, and on the day DST begins (02:30 does not exist) it runs right
// after the gap, at 03:00.
func ExampleAdd() {
	ctx := context.Background()
	pool, cleanup := testkit.ExampleDB(ctx)
	defer cleanup()

	engine, err := workflow.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	// The clock is fixed for the example; a service leaves Now nil (the database's clock).
	now := time.Date(2026, 3, 9, 12, 0, 0, 0, time.UTC)
	sched, err := schedule.New(engine, &schedule.Config{Now: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		log.Fatal(err)
	}
	err = schedule.Add(sched, schedule.Schedule[DailySettleArgs]{
		Name:    "settle",
		Spec:    "30 2 * * *",
		Zone:    "America/New_York",
		Misfire: schedule.CatchUpAll{Max: 30, PerTick: 5},
		Overlap: schedule.OverlapAllowAll,
		Shards:  2,
		Args: func(slot time.Time, shard int) DailySettleArgs {
			return DailySettleArgs{Date: slot.In(ny).Format(time.DateOnly), Shard: shard}
		},
		StartAt: time.Date(2026, 3, 7, 0, 0, 0, 0, ny),
	})
	if err != nil {
		log.Fatal(err)
	}

	// An insert-only client is enough to materialize. A service installs sched on its
	// working river.Config (sched.Install) instead of ticking by hand.
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		log.Fatal(err)
	}
	res, err := sched.Tick(ctx, client)
	if err != nil {
		log.Fatal(err)
	}
	tick := res.Schedule("settle")
	fmt.Println("runs started:", tick.RunsStarted)

	// The slots as an operator's tool reads them: a stepwise client that does none of the
	// service's work.
	operator, err := stepwise.NewOperatorClient(pool)
	if err != nil {
		log.Fatal(err)
	}
	reports, err := operator.SlotList(ctx, "settle", &stepwise.SlotListParams{Limit: 10})
	if err != nil {
		log.Fatal(err)
	}
	for i := len(reports) - 1; i >= 0; i-- {
		r := reports[i]
		fmt.Println(r.Slot.In(ny).Format("2006-01-02 15:04 MST"), r.Status, r.Runs)
	}
	fmt.Println(schedule.RunKey("settle", reports[0].Slot, 1))
	fmt.Println("merchant-42 is in shard", schedule.ShardOf("merchant-42", 2))

	// Output:
	// runs started: 6
	// 2026-03-07 02:30 EST RUNNING map[pending:2]
	// 2026-03-08 03:00 EDT RUNNING map[pending:2]
	// 2026-03-09 02:30 EDT RUNNING map[pending:2]
	// settle/2026-03-09T06:30:00Z/1
	// merchant-42 is in shard 0
}
