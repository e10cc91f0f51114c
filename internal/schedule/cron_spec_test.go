package schedule_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/schedule"
)

func mustParse(t testing.TB, spec string, loc *time.Location) *schedule.Spec {
	t.Helper()
	s, err := schedule.ParseSpec(spec, loc, schedule.GapRunAfter)
	require.NoError(t, err)
	return s
}

// chain follows Next n times from after and formats the slots in loc.
func chain(s *schedule.Spec, after time.Time, n int, loc *time.Location) []string {
	out := make([]string, 0, n)
	for at := after; len(out) < n; {
		at = s.Next(at)
		if at.IsZero() {
			out = append(out, "none")
			break
		}
		out = append(out, at.In(loc).Format("2006-01-02 15:04 Mon"))
	}
	return out
}

func TestCalendar(t *testing.T) {
	t.Parallel()

	utc := time.UTC
	tests := []struct {
		name  string
		spec  string
		after time.Time
		want  []string
	}{
		{
			name:  "day 31 skips 30-day months and February",
			spec:  "0 0 31 * *",
			after: time.Date(2026, 1, 1, 0, 0, 0, 0, utc),
			want:  []string{"2026-01-31 00:00 Sat", "2026-03-31 00:00 Tue", "2026-05-31 00:00 Sun", "2026-07-31 00:00 Fri", "2026-08-31 00:00 Mon"},
		},
		{
			name:  "leap day",
			spec:  "0 0 29 2 *",
			after: time.Date(2026, 1, 1, 0, 0, 0, 0, utc),
			want:  []string{"2028-02-29 00:00 Tue", "2032-02-29 00:00 Sun"},
		},
		{
			name:  "day 30 of February and April never exists but May's does",
			spec:  "0 12 30 feb,apr,may *",
			after: time.Date(2026, 1, 1, 0, 0, 0, 0, utc),
			want:  []string{"2026-04-30 12:00 Thu", "2026-05-30 12:00 Sat", "2027-04-30 12:00 Fri"},
		},
		{
			name:  "day of month OR day of week when both are restricted",
			spec:  "0 9 1,15 * mon",
			after: time.Date(2026, 6, 1, 9, 0, 0, 0, utc), // a Monday, the 1st
			want:  []string{"2026-06-08 09:00 Mon", "2026-06-15 09:00 Mon", "2026-06-22 09:00 Mon", "2026-06-29 09:00 Mon", "2026-07-01 09:00 Wed"},
		},
		{
			name:  "day of month AND day of week when one is star",
			spec:  "0 9 13 * *",
			after: time.Date(2026, 1, 1, 0, 0, 0, 0, utc),
			want:  []string{"2026-01-13 09:00 Tue", "2026-02-13 09:00 Fri"},
		},
		{
			name:  "weekdays at two fixed times",
			spec:  "0 9,17 * * 1-5",
			after: time.Date(2026, 7, 3, 12, 0, 0, 0, utc), // Friday
			want:  []string{"2026-07-03 17:00 Fri", "2026-07-06 09:00 Mon", "2026-07-06 17:00 Mon"},
		},
		{
			name:  "@daily",
			spec:  "@daily",
			after: time.Date(2026, 12, 31, 0, 0, 0, 0, utc),
			want:  []string{"2027-01-01 00:00 Fri", "2027-01-02 00:00 Sat"},
		},
		{
			name:  "@hourly",
			spec:  "@hourly",
			after: time.Date(2026, 12, 31, 22, 59, 59, 999999999, utc),
			want:  []string{"2026-12-31 23:00 Thu", "2027-01-01 00:00 Fri"},
		},
		{
			name:  "@weekly is Sunday midnight",
			spec:  "@weekly",
			after: time.Date(2026, 7, 1, 0, 0, 0, 0, utc),
			want:  []string{"2026-07-05 00:00 Sun", "2026-07-12 00:00 Sun"},
		},
		{
			name:  "@monthly",
			spec:  "@monthly",
			after: time.Date(2026, 1, 31, 0, 0, 0, 0, utc),
			want:  []string{"2026-02-01 00:00 Sun", "2026-03-01 00:00 Sun"},
		},
		{
			name:  "@yearly",
			spec:  "@yearly",
			after: time.Date(2026, 1, 1, 0, 0, 0, 0, utc),
			want:  []string{"2027-01-01 00:00 Fri"},
		},
		{
			name:  "strictly after: a slot equal to after is not next",
			spec:  "30 2 * * *",
			after: time.Date(2026, 5, 5, 2, 30, 0, 0, utc),
			want:  []string{"2026-05-06 02:30 Wed"},
		},
		{
			name:  "step from a value runs to the field's end",
			spec:  "50/5 23 * * *",
			after: time.Date(2026, 5, 5, 0, 0, 0, 0, utc),
			want:  []string{"2026-05-05 23:50 Tue", "2026-05-05 23:55 Tue", "2026-05-06 23:50 Wed"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := mustParse(t, tt.spec, utc)
			require.Equal(t, tt.want, chain(s, tt.after, len(tt.want), utc))
		})
	}
}

func TestNextWithinFiveYears(t *testing.T) {
	t.Parallel()

	s := mustParse(t, "0 0 29 2 *", time.UTC)
	// 2096 is the last leap year before 2104: 2100 is not one.
	require.True(t, s.Next(time.Date(2096, 3, 1, 0, 0, 0, 0, time.UTC)).IsZero())
	// Slots is bounded by until, not by five years.
	slots, truncated := s.Slots(time.Date(2096, 3, 1, 0, 0, 0, 0, time.UTC), time.Date(2105, 1, 1, 0, 0, 0, 0, time.UTC), 10)
	require.False(t, truncated)
	require.Equal(t, []time.Time{time.Date(2104, 2, 29, 0, 0, 0, 0, time.UTC)}, slots)

	start := time.Now()
	for range 100 {
		s.Next(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC))
	}
	require.Less(t, time.Since(start), time.Second, "Next for a leap-day spec must be cheap")
}

func TestZonePrefix(t *testing.T) {
	t.Parallel()

	ny := mustZone(t, "America/New_York")
	for _, spec := range []string{"CRON_TZ=Asia/Tokyo 0 9 * * *", "TZ=Asia/Tokyo 0 9 * * *", "  CRON_TZ=Asia/Tokyo\t0  9 * * * "} {
		t.Run(spec, func(t *testing.T) {
			t.Parallel()
			s, err := schedule.ParseSpec(spec, ny, schedule.GapRunAfter)
			require.NoError(t, err)
			require.Equal(t, "Asia/Tokyo", s.Location().String())
			// 09:00 JST is 00:00 UTC.
			require.Equal(t, time.Date(2026, 7, 2, 0, 0, 0, 0, time.UTC), s.Next(time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)))
		})
	}

	// The prefix also stands in for a missing zone argument.
	s, err := schedule.ParseSpec("CRON_TZ=UTC @daily", nil, schedule.GapSkip)
	require.NoError(t, err)
	require.Equal(t, time.UTC, s.Location())
	require.Equal(t, "CRON_TZ=UTC @daily", s.String())
}

func TestNextReturnsUTC(t *testing.T) {
	t.Parallel()

	ny := mustZone(t, "America/New_York")
	s := mustParse(t, "0 9 * * *", ny)
	next := s.Next(time.Date(2026, 7, 1, 0, 0, 0, 0, ny))
	require.Equal(t, time.UTC, next.Location())
	require.Equal(t, time.Date(2026, 7, 1, 13, 0, 0, 0, time.UTC), next)
}

func TestSlots(t *testing.T) {
	t.Parallel()

	s := mustParse(t, "*/15 * * * *", time.UTC)
	after := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	until := after.Add(2 * time.Hour) // 8 slots: 00:15 ... 02:00

	slots, truncated := s.Slots(after, until, 100)
	require.False(t, truncated)
	require.Len(t, slots, 8)
	require.Equal(t, after.Add(15*time.Minute), slots[0])
	require.Equal(t, until, slots[7], "until is inclusive")

	first, truncated := s.Slots(after, until, 5)
	require.True(t, truncated)
	require.Equal(t, slots[:5], first)
	rest, truncated := s.Slots(first[4], until, 5)
	require.False(t, truncated)
	require.Equal(t, slots[5:], rest)

	exact, truncated := s.Slots(after, until, 8)
	require.False(t, truncated, "exactly max slots is not truncated")
	require.Equal(t, slots, exact)

	none, truncated := s.Slots(after, until, 0)
	require.Empty(t, none)
	require.True(t, truncated)

	none, truncated = s.Slots(until, after, 10)
	require.Empty(t, none)
	require.False(t, truncated)
}

func TestLatest(t *testing.T) {
	t.Parallel()

	t.Run("ten hours of a per-minute spec", func(t *testing.T) {
		t.Parallel()
		s := mustParse(t, "* * * * *", time.UTC)
		after := time.Date(2026, 4, 1, 8, 0, 0, 0, time.UTC)
		until := after.Add(10 * time.Hour)

		latest, count := s.Latest(after, until)
		require.Equal(t, until, latest)
		require.Equal(t, 600, count)

		slots, truncated := s.Slots(after, until, 1000)
		require.False(t, truncated)
		require.Len(t, slots, 600)
		require.Equal(t, slots[599], latest)

		// Until between slots: the newest slot is the minute before.
		latest, count = s.Latest(after, until.Add(-time.Second))
		require.Equal(t, until.Add(-time.Minute), latest)
		require.Equal(t, 599, count)
	})

	t.Run("thirty-day outage of a per-minute spec across a DST switch", func(t *testing.T) {
		t.Parallel()
		ny := mustZone(t, "America/New_York")
		s := mustParse(t, "* * * * *", ny)
		after := time.Date(2026, 10, 15, 0, 0, 0, 0, time.UTC)
		until := after.Add(30 * 24 * time.Hour)

		start := time.Now()
		latest, count := s.Latest(after, until)
		elapsed := time.Since(start)
		require.Equal(t, until, latest)
		require.Equal(t, 43200, count, "absolute minutes: the repeated hour counts twice")
		require.Less(t, elapsed, 100*time.Millisecond)

		slots, truncated := s.Slots(after, until, 50000)
		require.False(t, truncated)
		require.Len(t, slots, count)
	})

	t.Run("fixed daily spec across both New York switches", func(t *testing.T) {
		t.Parallel()
		ny := mustZone(t, "America/New_York")
		s := mustParse(t, "30 2 * * *", ny)
		after := time.Date(2026, 1, 1, 0, 0, 0, 0, ny)
		until := time.Date(2027, 1, 1, 0, 0, 0, 0, ny)

		latest, count := s.Latest(after, until)
		require.Equal(t, 365, count, "one slot per local day, switch days included")
		require.Equal(t, time.Date(2026, 12, 31, 2, 30, 0, 0, ny).UTC(), latest)
	})

	t.Run("empty ranges", func(t *testing.T) {
		t.Parallel()
		s := mustParse(t, "0 9 * * *", time.UTC)
		at := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)

		latest, count := s.Latest(at, at)
		require.True(t, latest.IsZero())
		require.Zero(t, count)

		latest, count = s.Latest(at, at.Add(23*time.Hour))
		require.True(t, latest.IsZero())
		require.Zero(t, count)

		latest, count = s.Latest(at.Add(-time.Nanosecond), at)
		require.Equal(t, at, latest)
		require.Equal(t, 1, count)
	})
}

func TestParseErrors(t *testing.T) {
	t.Parallel()

	utc := time.UTC
	tests := []struct {
		spec   string
		zone   *time.Location // UTC when nil, unless noZone
		noZone bool
		gap    schedule.GapPolicy
		field  string
		want   string
	}{
		{spec: "61 * * * *", field: "minute", want: `cron spec "61 * * * *": minute field: value 61 out of range 0-59`},
		{spec: "0 24 * * *", field: "hour", want: `cron spec "0 24 * * *": hour field: value 24 out of range 0-23`},
		{spec: "0 0 0 * *", field: "day-of-month", want: `cron spec "0 0 0 * *": day-of-month field: value 0 out of range 1-31`},
		{spec: "0 0 * 13 *", field: "month", want: `cron spec "0 0 * 13 *": month field: value 13 out of range 1-12`},
		{spec: "0 0 * * 7", field: "day-of-week", want: `cron spec "0 0 * * 7": day-of-week field: value 7 out of range 0-6 (Sunday is 0)`},
		{spec: "0 0 * * mon-sun", field: "day-of-week", want: `cron spec "0 0 * * mon-sun": day-of-week field: range "mon-sun" runs backwards: write a range that wraps as two, e.g. "1-6,0-0"`},
		{spec: "0 22-2 * * *", field: "hour", want: `cron spec "0 22-2 * * *": hour field: range "22-2" runs backwards: write a range that wraps as two, e.g. "22-23,0-2"`},
		{spec: "*/0 * * * *", field: "minute", want: `cron spec "*/0 * * * *": minute field: step in "*/0" must be at least 1`},
		{spec: "*/x * * * *", field: "minute", want: `cron spec "*/x * * * *": minute field: step "x" in "*/x" is not a whole number`},
		{spec: "1/2/3 * * * *", field: "minute", want: `cron spec "1/2/3 * * * *": minute field: "1/2/3" has more than one "/"`},
		{spec: "0 1-2-3 * * *", field: "hour", want: `cron spec "0 1-2-3 * * *": hour field: "1-2-3" has more than one "-"`},
		{spec: "0 -5 * * *", field: "hour", want: `cron spec "0 -5 * * *": hour field: "-5" is missing a number`},
		{spec: "0 noon * * *", field: "hour", want: `cron spec "0 noon * * *": hour field: "noon" is not a number`},
		{spec: "0 0 * foo *", field: "month", want: `cron spec "0 0 * foo *": month field: "foo" is not a number or a name such as "jan"`},
		{spec: "0 , * * *", field: "hour", want: `cron spec "0 , * * *": hour field: "," selects no values: name at least one`},
		{spec: "0 0 30 2 *", field: "day-of-month", want: `cron spec "0 0 30 2 *": day-of-month field: none of the selected days exists in the selected months, so the spec would never fire`},
		{spec: "0 0 31 4,6,9,11 *", field: "day-of-month", want: `cron spec "0 0 31 4,6,9,11 *": day-of-month field: none of the selected days exists in the selected months, so the spec would never fire`},
		{spec: "0 0 * * * *", want: `cron spec "0 0 * * * *": want five fields (minute hour day-of-month month day-of-week), found 6: seconds are not supported`},
		{spec: "0 0 * *", want: `cron spec "0 0 * *": want five fields (minute hour day-of-month month day-of-week), found 4`},
		{spec: "  ", want: `cron spec "  ": empty spec: want five fields "minute hour day-of-month month day-of-week", or a descriptor such as @daily`},
		{spec: "@every 15m", want: `cron spec "@every 15m": @every is not supported: slots must sit on the calendar and be the same on every node, while @every counts from whenever a process starts; use "*/15 * * * *" instead`},
		{spec: "@every 2h", want: `cron spec "@every 2h": @every is not supported: slots must sit on the calendar and be the same on every node, while @every counts from whenever a process starts; use "0 */2 * * *" instead`},
		{spec: "@every 7h", want: `cron spec "@every 7h": @every is not supported: slots must sit on the calendar and be the same on every node, while @every counts from whenever a process starts; use five fields, e.g. "*/15 * * * *" or "0 */2 * * *"`},
		{spec: "@fortnightly", want: `cron spec "@fortnightly": unknown descriptor @fortnightly: use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly, or five fields`},
		{spec: "@daily 5", want: `cron spec "@daily 5": descriptor @daily takes no fields: drop "5"`},
		{spec: "CRON_TZ=Asia/Shangai 0 9 * * *", want: `cron spec "CRON_TZ=Asia/Shangai 0 9 * * *": unknown time zone "Asia/Shangai": use an IANA name such as "Europe/Berlin"; if the name is right, this host has no tz database (import _ "time/tzdata")`},
		{spec: "CRON_TZ=asia/tokyo 0 9 * * *", want: `cron spec "CRON_TZ=asia/tokyo 0 9 * * *": unknown time zone "asia/tokyo": did you mean "Asia/Tokyo"?`},
		{spec: "CRON_TZ=Asia/Tokyo", want: `cron spec "CRON_TZ=Asia/Tokyo": nothing after "CRON_TZ=Asia/Tokyo": add the five fields, e.g. "CRON_TZ=Asia/Tokyo 0 9 * * *"`},
		{spec: "CRON_TZ=UTC TZ=UTC 0 9 * * *", want: `cron spec "CRON_TZ=UTC TZ=UTC 0 9 * * *": more than one time zone prefix: keep one CRON_TZ=`},
		{spec: "TZ= 0 9 * * *", want: `cron spec "TZ= 0 9 * * *": empty time zone name: use an IANA name such as "America/New_York", or "UTC"`},
		{spec: "0 9 * * *", noZone: true, want: `cron spec "0 9 * * *": no time zone: pass one loaded with LoadZone, or prefix the spec with CRON_TZ=, e.g. "CRON_TZ=UTC 0 9 * * *"`},
		{spec: "0 9 * * *", zone: time.Local, want: `cron spec "0 9 * * *": time.Local is each host's own zone and differs between nodes: pass a zone loaded with LoadZone`},
		{spec: "0 9 * * *", gap: schedule.GapPolicy(7), want: `cron spec "0 9 * * *": unknown gap policy 7: use GapRunAfter or GapSkip`},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			t.Parallel()
			zone := tt.zone
			if zone == nil && !tt.noZone {
				zone = utc
			}
			s, err := schedule.ParseSpec(tt.spec, zone, tt.gap)
			require.Nil(t, s)
			require.EqualError(t, err, tt.want)
			require.ErrorIs(t, err, schedule.ErrInvalidSpec)

			var specErr *schedule.SpecError
			require.ErrorAs(t, err, &specErr)
			require.Equal(t, tt.spec, specErr.Spec)
			require.Equal(t, tt.field, specErr.Field)
		})
	}
}

func TestLoadZone(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		want string
	}{
		{name: "Asia/Shangai", want: `unknown time zone "Asia/Shangai": use an IANA name such as "Europe/Berlin"; if the name is right, this host has no tz database (import _ "time/tzdata")`},
		{name: "america/new_york", want: `unknown time zone "america/new_york": did you mean "America/New_York"?`},
		{name: "", want: `empty time zone name: use an IANA name such as "America/New_York", or "UTC"`},
		{name: "Local", want: `time zone "Local" is each host's own zone and differs between nodes: use an IANA name such as "America/New_York"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			loc, err := schedule.LoadZone(tt.name)
			require.Nil(t, loc)
			require.EqualError(t, err, tt.want)
			require.ErrorIs(t, err, schedule.ErrUnknownZone)
			require.False(t, errors.Is(err, schedule.ErrInvalidSpec))
		})
	}

	loc, err := schedule.LoadZone("Asia/Shanghai")
	require.NoError(t, err)
	require.Equal(t, "Asia/Shanghai", loc.String())

	// A bad prefix zone is both a spec error and a zone error.
	_, err = schedule.ParseSpec("CRON_TZ=Mars/Olympus 0 9 * * *", time.UTC, schedule.GapRunAfter)
	require.ErrorIs(t, err, schedule.ErrInvalidSpec)
	require.ErrorIs(t, err, schedule.ErrUnknownZone)
	var zoneErr *schedule.ZoneError
	require.ErrorAs(t, err, &zoneErr)
	require.Equal(t, "Mars/Olympus", zoneErr.Name)
}

func TestFixedTime(t *testing.T) {
	t.Parallel()

	for spec, fixed := range map[string]bool{
		"30 2 * * *":      true,
		"0 9,17 * * 1-5":  true,
		"0 0-23/6 * * *":  true,
		"0-59 0-23 * * *": true,
		"@daily":          true,
		"@midnight":       true,
		"@weekly":         true,
		"@monthly":        true,
		"@yearly":         true,
		"0 * * * *":       false,
		"*/15 9-17 * * *": false,
		"30 */2 * * *":    false,
		"? 3 * * *":       false,
		"5,* 3 * * *":     false,
		"@hourly":         false,
	} {
		require.Equal(t, fixed, mustParse(t, spec, time.UTC).FixedTime(), spec)
	}
}

func TestGapPolicyString(t *testing.T) {
	t.Parallel()

	require.Equal(t, "GapRunAfter", schedule.GapRunAfter.String())
	require.Equal(t, "GapSkip", schedule.GapSkip.String())
	require.Equal(t, "GapPolicy(9)", schedule.GapPolicy(9).String())
}

// TestConcurrentUse runs one Spec from many goroutines; with -race it
// checks that a Spec really is safe for concurrent use.
func TestConcurrentUse(t *testing.T) {
	t.Parallel()

	s := mustParse(t, "*/5 * * * *", mustZone(t, "Europe/Berlin"))
	after := time.Date(2026, 10, 24, 22, 0, 0, 0, time.UTC)
	until := after.Add(6 * time.Hour)
	want, _ := s.Slots(after, until, 1000)

	done := make(chan []time.Time)
	for range 8 {
		go func() {
			got, _ := s.Slots(after, until, 1000)
			done <- got
		}()
	}
	for range 8 {
		require.Equal(t, want, <-done)
	}
}

// TestLeapYearEndInRuleYears guards the workaround for golang/go#81583:
// ZoneBounds reports the end of the period that closes a leap year a day
// early in years a zone serves from its TZ rule. Walking periods must
// neither stall there nor invent a gap.
func TestLeapYearEndInRuleYears(t *testing.T) {
	t.Parallel()

	for _, zone := range []string{"Europe/Berlin", "America/New_York", "Australia/Sydney"} {
		for _, year := range []int{2040, 2056} {
			t.Run(fmt.Sprintf("%s/%d", zone, year), func(t *testing.T) {
				t.Parallel()
				loc := mustZone(t, zone)
				after := time.Date(year, 12, 30, 0, 0, 0, 0, loc)
				until := time.Date(year+1, 1, 2, 0, 0, 0, 0, loc)

				hourly, truncated := mustParse(t, "0 * * * *", loc).Slots(after, until, 1000)
				require.False(t, truncated)
				require.Len(t, hourly, 72)
				for i := 1; i < len(hourly); i++ {
					require.Equal(t, time.Hour, hourly[i].Sub(hourly[i-1]))
				}

				daily, truncated := mustParse(t, "30 9 * * *", loc).Slots(after, until, 1000)
				require.False(t, truncated)
				require.Equal(t, []string{"12-30 09:30", "12-31 09:30", "01-01 09:30"}, localClock(daily, loc))
			})
		}
	}
}

func localClock(slots []time.Time, loc *time.Location) []string {
	out := make([]string, 0, len(slots))
	for _, s := range slots {
		out = append(out, s.In(loc).Format("01-02 15:04"))
	}
	return out
}

func TestExtremeInstants(t *testing.T) {
	t.Parallel()

	s := mustParse(t, "0 9 * * *", mustZone(t, "Europe/Berlin"))
	far := time.Date(20000, 1, 1, 0, 0, 0, 0, time.UTC)
	require.True(t, s.Next(far).IsZero())
	require.True(t, s.Next(time.Unix(1<<62, 0)).IsZero())

	slots, truncated := s.Slots(time.Date(9999, 12, 29, 0, 0, 0, 0, time.UTC), far, 10)
	require.False(t, truncated)
	require.Len(t, slots, 3, "until beyond year 9999 is clamped, not refused")

	first := s.Next(time.Time{})
	require.Equal(t, 1, first.Year())

	latest, count := s.Latest(time.Date(9999, 12, 1, 0, 0, 0, 0, time.UTC), time.Unix(1<<62, 0))
	require.Equal(t, 31, count)
	require.Equal(t, time.Date(9999, 12, 31, 8, 0, 0, 0, time.UTC), latest)
}
