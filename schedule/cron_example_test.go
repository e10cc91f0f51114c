package schedule_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/stepwise-go/stepwise/schedule"
)

// A daily settlement at 02:30 New York time runs once on each local day,
// including the day 02:30 does not exist and the day 01:00-02:00 repeats.
func ExampleSpec_Slots() {
	ny, err := schedule.LoadZone("America/New_York")
	if err != nil {
		panic(err)
	}
	spec, err := schedule.ParseSpec("30 2 * * *", ny, schedule.GapRunAfter)
	if err != nil {
		panic(err)
	}

	watermark := time.Date(2026, 3, 6, 12, 0, 0, 0, ny)
	slots, _ := spec.Slots(watermark, watermark.Add(72*time.Hour), 10)
	for _, slot := range slots {
		fmt.Println(slot.Format(time.RFC3339), "=", slot.In(ny).Format("Mon 15:04 MST"))
	}
	// Output:
	// 2026-03-07T07:30:00Z = Sat 02:30 EST
	// 2026-03-08T07:00:00Z = Sun 03:00 EDT
	// 2026-03-09T06:30:00Z = Mon 02:30 EDT
}

// After an outage, a run-latest misfire policy runs only the newest missed
// slot and records how many it skipped.
func ExampleSpec_Latest() {
	spec, err := schedule.ParseSpec("*/5 * * * *", time.UTC, schedule.GapRunAfter)
	if err != nil {
		panic(err)
	}

	watermark := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	now := time.Date(2026, 5, 31, 0, 2, 0, 0, time.UTC)
	latest, count := spec.Latest(watermark, now)
	fmt.Println(latest.Format(time.RFC3339), count)
	// Output:
	// 2026-05-31T00:00:00Z 8640
}

func ExampleParse_error() {
	_, err := schedule.ParseSpec("0 2 * * 7", time.UTC, schedule.GapRunAfter)
	fmt.Println(err)
	_, err = schedule.ParseSpec("@every 1h", time.UTC, schedule.GapRunAfter)
	fmt.Println(err)
	// Output:
	// cron spec "0 2 * * 7": day-of-week field: value 7 out of range 0-6 (Sunday is 0)
	// cron spec "@every 1h": @every is not supported: slots must sit on the calendar and be the same on every node, while @every counts from whenever a process starts; use "0 * * * *" instead
}

// A business date is a day in the schedule's zone. Tokyo's 00:30 is the previous day in UTC,
// so reading the date off the UTC slot would settle the wrong day.
func ExampleSpec_SlotOn() {
	tokyo, err := schedule.LoadZone("Asia/Tokyo")
	if err != nil {
		panic(err)
	}
	spec, err := schedule.ParseSpec("30 0 * * *", tokyo, schedule.GapRunAfter)
	if err != nil {
		panic(err)
	}

	date, _ := time.Parse(time.DateOnly, "2026-03-08")
	slot, err := spec.SlotOn(date)
	if err != nil {
		panic(err)
	}
	fmt.Println(slot.Format(time.RFC3339), "is the slot of", spec.DateOf(slot).Format(time.DateOnly))
	fmt.Println(schedule.RunKeys("settle", slot, 2))

	twice, err := schedule.ParseSpec("0 9,17 * * *", tokyo, schedule.GapRunAfter)
	if err != nil {
		panic(err)
	}
	_, err = twice.SlotOn(date)
	fmt.Println(errors.Is(err, schedule.ErrSeveralSlotsOnDate), len(twice.SlotsOn(date)))
	// Output:
	// 2026-03-07T15:30:00Z is the slot of 2026-03-08
	// [settle/2026-03-07T15:30:00Z/0 settle/2026-03-07T15:30:00Z/1]
	// true 2
}
