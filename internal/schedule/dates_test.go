package schedule_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/schedule"
)

func mustDate(t testing.TB, s string) time.Time {
	t.Helper()
	d, err := time.Parse(time.DateOnly, s)
	require.NoError(t, err)
	return d
}

func rfc3339(slots []time.Time) []string {
	out := make([]string, 0, len(slots))
	for _, s := range slots {
		out = append(out, s.Format(time.RFC3339))
	}
	return out
}

// A date's slots are the ones its zone's wall clock shows on that day, whatever the UTC date,
// through DST switches, gaps at midnight and a day a zone skipped entirely.
func TestSlotsOn(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		spec, zone string
		gap        schedule.GapPolicy
		date       string
		want       []string // RFC 3339, UTC; nil: no slot
		wantCount  int      // instead of want, for many slots
	}{
		{name: "plain day", spec: "30 2 * * *", zone: "America/New_York", date: "2026-03-07", want: []string{"2026-03-07T07:30:00Z"}},
		// 02:30 does not exist on the spring-forward day: the slot is right after the gap.
		{name: "spring forward, GapRunAfter", spec: "30 2 * * *", zone: "America/New_York", date: "2026-03-08", want: []string{"2026-03-08T07:00:00Z"}},
		{name: "spring forward, GapSkip", spec: "30 2 * * *", zone: "America/New_York", gap: schedule.GapSkip, date: "2026-03-08"},
		// 01:30 happens twice on the fall-back day: the first one only.
		{name: "fall back", spec: "30 1 * * *", zone: "America/New_York", date: "2026-11-01", want: []string{"2026-11-01T05:30:00Z"}},
		{name: "Berlin spring forward", spec: "30 2 * * *", zone: "Europe/Berlin", date: "2026-03-29", want: []string{"2026-03-29T01:00:00Z"}},
		{name: "Berlin fall back", spec: "30 2 * * *", zone: "Europe/Berlin", date: "2026-10-25", want: []string{"2026-10-25T00:30:00Z"}},
		{name: "hourly, spring forward", spec: "0 * * * *", zone: "America/New_York", date: "2026-03-08", wantCount: 23},
		{name: "hourly, fall back", spec: "0 * * * *", zone: "America/New_York", date: "2026-11-01", wantCount: 25},
		{name: "hourly, plain day", spec: "0 * * * *", zone: "America/New_York", date: "2026-11-02", wantCount: 24},
		{name: "twice a day", spec: "0 1,13 * * *", zone: "America/New_York", date: "2026-11-01", want: []string{"2026-11-01T05:00:00Z", "2026-11-01T18:00:00Z"}},
		{name: "weekly, another weekday", spec: "0 1 * * 1", zone: "UTC", date: "2026-11-01"},
		// Local midnight is a day ahead of UTC: the slot's UTC date is the day before.
		{name: "ahead of UTC", spec: "0 0 * * *", zone: "Asia/Tokyo", date: "2026-03-01", want: []string{"2026-02-28T15:00:00Z"}},
		{name: "fourteen hours ahead", spec: "0 0 * * *", zone: "Pacific/Kiritimati", date: "2026-03-01", want: []string{"2026-02-28T10:00:00Z"}},
		{name: "eleven hours behind", spec: "0 23 * * *", zone: "Pacific/Pago_Pago", date: "2026-03-01", want: []string{"2026-03-02T10:00:00Z"}},
		// Sao Paulo sprang forward at midnight: 00:00 of 2018-11-04 never showed, 01:00 did.
		{name: "gap at midnight", spec: "0 0 * * *", zone: "America/Sao_Paulo", date: "2018-11-04", want: []string{"2018-11-04T03:00:00Z"}},
		// Samoa skipped 2011-12-30 when it crossed the date line: no slot that day; the skipped
		// noon runs right after the gap, at midnight of the 31st, beside the 31st's own.
		{name: "a day the zone skipped", spec: "0 12 * * *", zone: "Pacific/Apia", date: "2011-12-30"},
		{name: "the day after the skipped one", spec: "0 12 * * *", zone: "Pacific/Apia", date: "2011-12-31", want: []string{"2011-12-30T10:00:00Z", "2011-12-30T22:00:00Z"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			loc := mustZone(t, tt.zone)
			spec, err := schedule.ParseSpec(tt.spec, loc, tt.gap)
			require.NoError(t, err)
			date := mustDate(t, tt.date)
			slots := spec.SlotsOn(date)
			if tt.wantCount > 0 {
				require.Len(t, slots, tt.wantCount)
			} else {
				require.Equal(t, tt.want, func() []string {
					if len(slots) == 0 {
						return nil
					}
					return rfc3339(slots)
				}())
			}
			for _, slot := range slots {
				require.Equal(t, time.UTC, slot.Location())
				require.Equal(t, date, spec.DateOf(slot), "slot %s", slot)
			}

			one, err := spec.SlotOn(date)
			switch len(slots) {
			case 0:
				require.ErrorIs(t, err, schedule.ErrNoSlotOnDate)
				require.ErrorContains(t, err, fmt.Sprintf("cron spec %q in %s", tt.spec, tt.zone))
				require.ErrorContains(t, err, "has no slot on "+tt.date)
				require.True(t, one.IsZero())
			case 1:
				require.NoError(t, err)
				require.Equal(t, slots[0], one)
			default:
				require.ErrorIs(t, err, schedule.ErrSeveralSlotsOnDate)
				require.ErrorContains(t, err, fmt.Sprintf("has %d slots on %s (%s", len(slots), tt.date, slots[0].Format(time.RFC3339)))
				require.ErrorContains(t, err, "take them all with SlotsOn")
				require.True(t, one.IsZero())
			}
		})
	}
}

// The dates' slots, day after day, are exactly the spec's chain: none lost between two days,
// none on two. Checked over whole years that hold DST switches and the day Samoa skipped.
func TestSlotsOnPartitionTheChain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		spec, zone string
		gap        schedule.GapPolicy
		year       int
	}{
		{"30 2 * * *", "America/New_York", schedule.GapRunAfter, 2026},
		{"30 2 * * *", "America/New_York", schedule.GapSkip, 2026},
		{"15,45 1,2 * * *", "Europe/Berlin", schedule.GapRunAfter, 2026},
		{"0 */5 * * *", "Australia/Lord_Howe", schedule.GapRunAfter, 2026}, // half-hour DST
		{"0 0 * * 1-5", "America/Sao_Paulo", schedule.GapRunAfter, 2018},
		{"0 12 * * *", "Pacific/Apia", schedule.GapRunAfter, 2011},
	} {
		loc := mustZone(t, tc.zone)
		spec, err := schedule.ParseSpec(tc.spec, loc, tc.gap)
		require.NoError(t, err)
		first := time.Date(tc.year, 1, 1, 0, 0, 0, 0, time.UTC)
		var byDate []time.Time
		for d := first; d.Year() == tc.year; d = d.AddDate(0, 0, 1) {
			byDate = append(byDate, spec.SlotsOn(d)...)
		}
		require.NotEmpty(t, byDate)
		// The chain from just before the first date's first instant to just after the last's.
		chain, truncated := spec.Slots(byDate[0].Add(-time.Second), byDate[len(byDate)-1], 1<<20)
		require.False(t, truncated)
		require.Equal(t, rfc3339(chain), rfc3339(byDate), "%s in %s", tc.spec, tc.zone)
		require.Equal(t, first, spec.DateOf(byDate[0]))
		require.Equal(t, tc.year, spec.DateOf(byDate[len(byDate)-1]).Year())
	}
}

// Only the date's calendar day counts, not its clock time or its zone.
func TestSlotsOnReadsTheCalendarDayOnly(t *testing.T) {
	t.Parallel()
	ny := mustZone(t, "America/New_York")
	spec, err := schedule.ParseSpec("30 2 * * *", ny, schedule.GapRunAfter)
	require.NoError(t, err)
	want, err := spec.SlotOn(mustDate(t, "2026-03-07"))
	require.NoError(t, err)
	for _, d := range []time.Time{
		time.Date(2026, 3, 7, 23, 59, 59, 999, time.UTC),
		time.Date(2026, 3, 7, 0, 0, 0, 0, mustZone(t, "Asia/Tokyo")),
		time.Date(2026, 3, 7, 23, 0, 0, 0, mustZone(t, "Pacific/Pago_Pago")),
	} {
		got, err := spec.SlotOn(d)
		require.NoError(t, err)
		require.Equal(t, want, got, "date %s", d)
	}
}

// The error for a date without a slot says which slot comes next, and on which date.
func TestSlotOnNamesTheNextSlot(t *testing.T) {
	t.Parallel()
	ny := mustZone(t, "America/New_York")
	spec, err := schedule.ParseSpec("30 2 * * *", ny, schedule.GapSkip)
	require.NoError(t, err)
	_, err = spec.SlotOn(mustDate(t, "2026-03-08"))
	require.EqualError(t, err, `no slot on the date: cron spec "30 2 * * *" in America/New_York (GapSkip) has no slot on 2026-03-08 `+
		`(its next slot is 2026-03-09T06:30:00Z, on 2026-03-09); pick a date the spec fires on, or a spec that fires every day`)

	weekly, err := schedule.ParseSpec("0 1 * * 1", time.UTC, schedule.GapRunAfter)
	require.NoError(t, err)
	_, err = weekly.SlotOn(mustDate(t, "2026-11-04"))
	require.ErrorIs(t, err, schedule.ErrNoSlotOnDate)
	require.ErrorContains(t, err, "its next slot is 2026-11-09T01:00:00Z, on 2026-11-09")
}

// A Schedule finds its date's slot itself, and RunKeys gives that slot's runs: the keys a tick
// and StartSlot use.
func TestScheduleSlotOnAndRunKeys(t *testing.T) {
	t.Parallel()
	sch := schedule.Schedule[slotArgs]{Name: "settle", Spec: "30 2 * * *", Zone: "America/New_York", Shards: 3}
	slot, err := sch.SlotOn(mustDate(t, "2026-03-08"))
	require.NoError(t, err)
	require.Equal(t, "2026-03-08T07:00:00Z", slot.Format(time.RFC3339))
	require.Equal(t, []string{
		"settle/2026-03-08T07:00:00Z/0", "settle/2026-03-08T07:00:00Z/1", "settle/2026-03-08T07:00:00Z/2",
	}, schedule.RunKeys(sch.Name, slot, sch.Shards))
	require.Empty(t, schedule.RunKeys(sch.Name, slot, 0))

	sch.Gap = schedule.GapSkip
	_, err = sch.SlotOn(mustDate(t, "2026-03-08"))
	require.ErrorIs(t, err, schedule.ErrNoSlotOnDate)
	require.ErrorContains(t, err, `schedule "settle": no slot on the date: cron spec "30 2 * * *" in America/New_York (GapSkip) has no slot on 2026-03-08`)

	sch.Zone = "America/New_york"
	_, err = sch.SlotOn(mustDate(t, "2026-03-08"))
	require.ErrorIs(t, err, schedule.ErrInvalid)
	require.ErrorContains(t, err, `schedule "settle": Zone: unknown time zone "America/New_york": did you mean "America/New_York"?`)

	sch.Zone, sch.Spec = "", "CRON_TZ=Asia/Tokyo 0 0 * * *"
	slot, err = sch.SlotOn(mustDate(t, "2026-03-01"))
	require.NoError(t, err)
	require.Equal(t, "2026-02-28T15:00:00Z", slot.Format(time.RFC3339))
}

type slotArgs struct{}

func (slotArgs) Kind() string { return "slot_args" }
