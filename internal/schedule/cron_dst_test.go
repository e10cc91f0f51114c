package schedule_test

import (
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/schedule"

	// Real zone rules in every test run, whatever the host has installed.
	_ "time/tzdata"
)

func mustZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := schedule.LoadZone(name)
	require.NoError(t, err)
	return loc
}

// localSlots formats slots as the local clock shows them, zone abbreviation
// included so that 01:30 EDT and 01:30 EST differ.
func localSlots(slots []time.Time, loc *time.Location) []string {
	out := make([]string, 0, len(slots))
	for _, s := range slots {
		out = append(out, s.In(loc).Format("15:04 MST"))
	}
	return out
}

// TestDSTSwitchDays asserts the slots around each switch on the real switch
// days, and how many slots the whole local day holds.
func TestDSTSwitchDays(t *testing.T) {
	t.Parallel()

	type dstCase struct {
		zone   string
		date   string // local day, YYYY-MM-DD
		spec   string
		gap    schedule.GapPolicy
		fixed  bool
		from   int      // window start, local hour on date (inclusive)
		to     int      // window end, local hour on date (exclusive)
		want   []string // slots in the window
		perDay int      // slots in the whole local day
	}

	const (
		nySpring     = "2026-03-08" // 02:00 EST -> 03:00 EDT
		nyFall       = "2026-11-01" // 02:00 EDT -> 01:00 EST
		berlinSpring = "2026-03-29" // 02:00 CET -> 03:00 CEST
		berlinFall   = "2026-10-25" // 03:00 CEST -> 02:00 CET
	)
	ny := func(date, spec string, gap schedule.GapPolicy, fixed bool, perDay int, want ...string) dstCase {
		return dstCase{zone: "America/New_York", date: date, spec: spec, gap: gap, fixed: fixed, from: 0, to: 4, want: want, perDay: perDay}
	}
	run, skip := schedule.GapRunAfter, schedule.GapSkip

	tests := []dstCase{
		// A fixed time in the spring gap runs right after it, or not at all.
		ny(nySpring, "30 2 * * *", run, true, 1, "03:00 EDT"),
		ny(nySpring, "30 2 * * *", skip, true, 0),
		ny(nyFall, "30 2 * * *", run, true, 1, "02:30 EST"),
		ny(nyFall, "30 2 * * *", skip, true, 1, "02:30 EST"),
		// A fixed time that happens twice runs at its first occurrence.
		ny(nySpring, "30 1 * * *", run, true, 1, "01:30 EST"),
		ny(nyFall, "30 1 * * *", run, true, 1, "01:30 EDT"),
		ny(nyFall, "30 1 * * *", skip, true, 1, "01:30 EDT"),
		// Two gap times of one spec share the one instant after the gap.
		ny(nySpring, "15,45 2 * * *", run, true, 1, "03:00 EDT"),
		ny(nySpring, "15,45 2 * * *", skip, true, 0),
		ny(nyFall, "15,45 2 * * *", run, true, 2, "02:15 EST", "02:45 EST"),
		// Every local hour, fixed: 02:00 merges into 03:00; the repeated
		// 01:00 runs once.
		ny(nySpring, "0 0-23 * * *", run, true, 23, "00:00 EST", "01:00 EST", "03:00 EDT"),
		ny(nySpring, "0 0-23 * * *", skip, true, 23, "00:00 EST", "01:00 EST", "03:00 EDT"),
		ny(nyFall, "0 0-23 * * *", run, true, 24, "00:00 EDT", "01:00 EDT", "02:00 EST", "03:00 EST"),
		// Wildcard hours follow absolute time: every real hour, once.
		ny(nySpring, "0 * * * *", run, false, 23, "00:00 EST", "01:00 EST", "03:00 EDT"),
		ny(nySpring, "0 * * * *", skip, false, 23, "00:00 EST", "01:00 EST", "03:00 EDT"),
		ny(nyFall, "0 * * * *", run, false, 25, "00:00 EDT", "01:00 EDT", "01:00 EST", "02:00 EST", "03:00 EST"),
		ny(nyFall, "@hourly", run, false, 25, "00:00 EDT", "01:00 EDT", "01:00 EST", "02:00 EST", "03:00 EST"),
		ny(nySpring, "*/30 * * * *", run, false, 46,
			"00:00 EST", "00:30 EST", "01:00 EST", "01:30 EST", "03:00 EDT", "03:30 EDT"),
		ny(nyFall, "*/30 * * * *", run, false, 50,
			"00:00 EDT", "00:30 EDT", "01:00 EDT", "01:30 EDT", "01:00 EST", "01:30 EST",
			"02:00 EST", "02:30 EST", "03:00 EST", "03:30 EST"),
		ny(nySpring, "*/15 * * * *", run, false, 92,
			"00:00 EST", "00:15 EST", "00:30 EST", "00:45 EST", "01:00 EST", "01:15 EST", "01:30 EST", "01:45 EST",
			"03:00 EDT", "03:15 EDT", "03:30 EDT", "03:45 EDT"),
		ny(nyFall, "*/15 * * * *", skip, false, 100,
			"00:00 EDT", "00:15 EDT", "00:30 EDT", "00:45 EDT", "01:00 EDT", "01:15 EDT", "01:30 EDT", "01:45 EDT",
			"01:00 EST", "01:15 EST", "01:30 EST", "01:45 EST", "02:00 EST", "02:15 EST", "02:30 EST", "02:45 EST",
			"03:00 EST", "03:15 EST", "03:30 EST", "03:45 EST"),
		// A wildcard minute in a fixed hour is a wildcard spec: none in the
		// skipped hour, both copies of the repeated one.
		ny(nySpring, "*/30 2 * * *", run, false, 0),
		ny(nyFall, "*/30 1 * * *", run, false, 4, "01:00 EDT", "01:30 EDT", "01:00 EST", "01:30 EST"),
		// Midnight exists on both days; @daily is untouched.
		ny(nySpring, "@daily", run, true, 1, "00:00 EST"),
		ny(nyFall, "@daily", run, true, 1, "00:00 EDT"),

		// Berlin switches at 02:00/03:00 local, on different days than New York.
		{zone: "Europe/Berlin", date: berlinSpring, spec: "30 2 * * *", gap: run, fixed: true, from: 0, to: 5, perDay: 1,
			want: []string{"03:00 CEST"}},
		{zone: "Europe/Berlin", date: berlinSpring, spec: "30 2 * * *", gap: skip, fixed: true, from: 0, to: 5, perDay: 0},
		{zone: "Europe/Berlin", date: berlinFall, spec: "30 2 * * *", gap: run, fixed: true, from: 0, to: 5, perDay: 1,
			want: []string{"02:30 CEST"}},
		{zone: "Europe/Berlin", date: berlinSpring, spec: "0 * * * *", gap: run, fixed: false, from: 0, to: 5, perDay: 23,
			want: []string{"00:00 CET", "01:00 CET", "03:00 CEST", "04:00 CEST"}},
		{zone: "Europe/Berlin", date: berlinFall, spec: "0 * * * *", gap: run, fixed: false, from: 0, to: 5, perDay: 25,
			want: []string{"00:00 CEST", "01:00 CEST", "02:00 CEST", "02:00 CET", "03:00 CET", "04:00 CET"}},
		{zone: "Europe/Berlin", date: berlinFall, spec: "*/30 2 * * *", gap: run, fixed: false, from: 0, to: 5, perDay: 4,
			want: []string{"02:00 CEST", "02:30 CEST", "02:00 CET", "02:30 CET"}},
		{zone: "Europe/Berlin", date: nySpring, spec: "30 2 * * *", gap: run, fixed: true, from: 0, to: 5, perDay: 1,
			want: []string{"02:30 CET"}},

		// No DST: the same slots every day.
		{zone: "Asia/Shanghai", date: nySpring, spec: "30 2 * * *", gap: skip, fixed: true, from: 0, to: 4, perDay: 1,
			want: []string{"02:30 CST"}},
		{zone: "Asia/Shanghai", date: berlinFall, spec: "0 * * * *", gap: run, fixed: false, from: 0, to: 4, perDay: 24,
			want: []string{"00:00 CST", "01:00 CST", "02:00 CST", "03:00 CST"}},
		{zone: "UTC", date: nyFall, spec: "30 1 * * *", gap: run, fixed: true, from: 0, to: 4, perDay: 1,
			want: []string{"01:30 UTC"}},
		{zone: "UTC", date: nySpring, spec: "*/30 * * * *", gap: skip, fixed: false, from: 1, to: 3, perDay: 48,
			want: []string{"01:00 UTC", "01:30 UTC", "02:00 UTC", "02:30 UTC"}},
	}

	for _, tt := range tests {
		t.Run(tt.zone+"/"+tt.date+"/"+tt.spec+"/"+tt.gap.String(), func(t *testing.T) {
			t.Parallel()

			loc := mustZone(t, tt.zone)
			spec, err := schedule.ParseSpec(tt.spec, loc, tt.gap)
			require.NoError(t, err)
			require.Equal(t, tt.fixed, spec.FixedTime())

			day, err := time.ParseInLocation(time.DateOnly, tt.date, loc)
			require.NoError(t, err)
			at := func(days, hour int) time.Time {
				return time.Date(day.Year(), day.Month(), day.Day()+days, hour, 0, 0, 0, loc)
			}

			// Window [from, to): Slots takes (after, until].
			got, truncated := spec.Slots(at(0, tt.from).Add(-time.Nanosecond), at(0, tt.to).Add(-time.Nanosecond), 1000)
			require.False(t, truncated)
			want := tt.want
			if want == nil {
				want = []string{}
			}
			require.Equal(t, want, localSlots(got, loc))

			dayStart, dayEnd := at(0, 0).Add(-time.Nanosecond), at(1, 0).Add(-time.Nanosecond)
			all, truncated := spec.Slots(dayStart, dayEnd, 1000)
			require.False(t, truncated)
			require.Len(t, all, tt.perDay)
			latest, count := spec.Latest(dayStart, dayEnd)
			require.Equal(t, tt.perDay, count)
			if tt.perDay > 0 {
				require.Equal(t, all[len(all)-1], latest)
			}
		})
	}
}

// TestRobfigNextForComparison records what robfig/cron's own Next does on
// New York's 2026 switch days, next to this package's slots, so that the
// reason this package exists stays visible (and a robfig upgrade that
// changes it gets noticed).
func TestRobfigNextForComparison(t *testing.T) {
	t.Parallel()

	ny := mustZone(t, "America/New_York")
	robfigChain := func(spec string, from time.Time, n int) []string {
		sched, err := cron.ParseStandard("CRON_TZ=America/New_York " + spec)
		require.NoError(t, err)
		var out []time.Time
		for at := from; len(out) < n; {
			at = sched.Next(at)
			out = append(out, at)
		}
		return localDates(out, ny)
	}
	ourChain := func(spec string, from time.Time, n int) []string {
		s, err := schedule.ParseSpec(spec, ny, schedule.GapRunAfter)
		require.NoError(t, err)
		var out []time.Time
		for at := from; len(out) < n; {
			at = s.Next(at)
			out = append(out, at)
		}
		return localDates(out, ny)
	}

	springEve := time.Date(2026, 3, 7, 12, 0, 0, 0, ny)
	// robfig: no run on 03-08 at all.
	require.Equal(t, []string{"03-09 02:30 EDT"}, robfigChain("30 2 * * *", springEve, 1))
	require.Equal(t, []string{"03-08 03:00 EDT", "03-09 02:30 EDT"}, ourChain("30 2 * * *", springEve, 2))

	fallEve := time.Date(2026, 10, 31, 12, 0, 0, 0, ny)
	// robfig: 01:30 twice on 11-01, an hour apart.
	require.Equal(t, []string{"11-01 01:30 EDT", "11-01 01:30 EST", "11-02 01:30 EST"}, robfigChain("30 1 * * *", fallEve, 3))
	require.Equal(t, []string{"11-01 01:30 EDT", "11-02 01:30 EST"}, ourChain("30 1 * * *", fallEve, 2))
}

func localDates(slots []time.Time, loc *time.Location) []string {
	out := make([]string, 0, len(slots))
	for _, s := range slots {
		out = append(out, s.In(loc).Format("01-02 15:04 MST"))
	}
	return out
}
