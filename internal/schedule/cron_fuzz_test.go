package schedule_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/schedule"
)

// fuzzZones covers the ways zones misbehave: none (UTC, Shanghai,
// Kathmandu), hour switches north and south, 30-minute (Lord Howe) and
// 2-hour (Troll) switches, switches at midnight (Santiago, Havana, Sao Paulo,
// Tehran), odd offsets (Chatham +12:45, St Johns -3:30), negative DST
// (Dublin, Casablanca's Ramadan switches) and a skipped calendar day
// (Apia, 2011-12-30).
var fuzzZones = []string{
	"UTC", "America/New_York", "Europe/Berlin", "Asia/Shanghai", "Australia/Lord_Howe",
	"America/Santiago", "Pacific/Chatham", "America/St_Johns", "Pacific/Apia", "America/Havana",
	"Africa/Casablanca", "Europe/Dublin", "Asia/Gaza", "America/Sao_Paulo", "Australia/Sydney",
	"Antarctica/Troll", "Asia/Tehran", "Asia/Kathmandu", "Europe/London", "America/Los_Angeles",
}

var (
	monthNames = []string{"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}
	dowNames   = []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}
	fuzzEpoch  = time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC)
)

// genField builds one field in robfig's grammar from r.
func genField(r *rand.Rand, lo, hi int, names []string) string {
	n := hi - lo + 1
	val := func() string {
		v := lo + r.IntN(n)
		if names != nil && r.IntN(3) == 0 {
			return names[v-lo]
		}
		return strconv.Itoa(v)
	}
	rng := func() string {
		a, b := lo+r.IntN(n), lo+r.IntN(n)
		a, b = min(a, b), max(a, b)
		return fmt.Sprintf("%d-%d", a, b)
	}
	switch r.IntN(10) {
	case 0, 1:
		return "*"
	case 2:
		return fmt.Sprintf("*/%d", 1+r.IntN(n))
	case 3:
		return val()
	case 4:
		return rng()
	case 5:
		return fmt.Sprintf("%s/%d", rng(), 1+r.IntN(n))
	case 6:
		parts := make([]string, 2+r.IntN(2))
		for i := range parts {
			if r.IntN(2) == 0 {
				parts[i] = val()
			} else {
				parts[i] = rng()
			}
		}
		return strings.Join(parts, ",")
	case 7:
		return fmt.Sprintf("%d/%d", lo+r.IntN(n), 1+r.IntN(n))
	case 8:
		return "?"
	default:
		return fmt.Sprintf("%s,*/%d", val(), 1+r.IntN(n))
	}
}

// genSpec returns a spec built from the seed, and whether its minute and
// hour fields make it a fixed-time spec, decided here from the text.
func genSpec(seed uint64) (string, bool) {
	r := rand.New(rand.NewPCG(seed, seed>>32^0x9e3779b97f4a7c15))
	if r.IntN(20) == 0 {
		d := []string{"@yearly", "@monthly", "@weekly", "@daily", "@hourly"}[r.IntN(5)]
		return d, d != "@hourly"
	}
	fields := []string{
		genField(r, 0, 59, nil),
		genField(r, 0, 23, nil),
		genField(r, 1, 31, nil),
		genField(r, 1, 12, monthNames),
		genField(r, 0, 6, dowNames),
	}
	// Sparse minute sets keep most cases small; dense ones still come up.
	if r.IntN(3) > 0 && strings.HasPrefix(fields[0], "*") {
		fields[0] = strconv.Itoa(r.IntN(60))
	}
	wild := func(f string) bool {
		for part := range strings.SplitSeq(f, ",") {
			if strings.HasPrefix(part, "*") || strings.HasPrefix(part, "?") {
				return true
			}
		}
		return false
	}
	return strings.Join(fields, " "), !wild(fields[0]) && !wild(fields[1])
}

// fuzzStart picks the watermark: anywhere in 1980-2059, or within a day of
// one of the zone's transitions in a year.
func fuzzStart(loc *time.Location, start int64, near bool) time.Time {
	u := uint64(start)
	ns := time.Duration(u>>34) % time.Second
	if !near {
		return fuzzEpoch.Add(time.Duration(u%(80*365*24*3600))*time.Second + ns)
	}
	year := 1980 + int(u%80)
	var transitions []time.Time
	for t := time.Date(year, 1, 1, 0, 0, 0, 0, loc); t.Year() == year; {
		_, end := t.ZoneBounds()
		switch {
		case end.IsZero():
			t = time.Date(year+1, 1, 1, 0, 0, 0, 0, loc)
		case !end.After(t): // golang/go#81583, see periodAt
			t = t.Add(24 * time.Hour)
		default:
			transitions = append(transitions, end)
			t = end
		}
	}
	shift := time.Duration((u>>8)%(2*24*3600))*time.Second - 24*time.Hour
	if len(transitions) == 0 {
		return time.Date(year, 1, 1, 0, 0, 0, 0, loc).Add(shift + ns)
	}
	return transitions[int((u>>20)%uint64(len(transitions)))].Add(shift + ns)
}

// bruteSlots is the reference: it walks absolute time minute by minute,
// reads the local clock, and applies the policy in its plainest form. A
// wildcard spec is due whenever the clock shows a matching time; a fixed-time
// spec is due when the clock first shows a matching time, or (GapRunAfter)
// first jumps over one. Which wall times match is robfig/cron's own answer,
// asked in UTC where no clock ever jumps.
func bruteSlots(t *testing.T, spec string, loc *time.Location, fixed bool, gap schedule.GapPolicy, after, until time.Time) []time.Time {
	t.Helper()
	sched, err := cron.ParseStandard("CRON_TZ=UTC " + spec)
	require.NoError(t, err)

	wallOf := func(u int64) int64 {
		_, off := time.Unix(u, 0).In(loc).Zone()
		return u + int64(off)
	}
	start := after.Truncate(time.Minute).Add(-3 * 24 * time.Hour).Unix()
	end := until.Unix()

	match := map[int64]bool{}
	lastWall := wallOf(end) + 2*24*3600
	for w := time.Unix(wallOf(start)-2*24*3600, 0).UTC(); ; {
		w = sched.Next(w)
		if w.IsZero() || w.Unix() > lastWall {
			break
		}
		match[w.Unix()] = true
	}

	var out []time.Time
	seen := wallOf(start) // the clock has shown every wall time below this
	for u := start; u <= end; u += 60 {
		w := wallOf(u)
		require.Zero(t, w%60, "zone offsets in the fuzz range are whole minutes")
		due := false
		if !fixed {
			due = match[w]
		} else if w >= seen {
			due = match[w]
			for x := seen; x < w && !due && gap == schedule.GapRunAfter; x += 60 {
				due = match[x]
			}
			seen = w + 60
		}
		if due && u > after.Unix() {
			out = append(out, time.Unix(u, 0).UTC())
		}
	}
	return out
}

func FuzzSlots(f *testing.F) {
	for i, seed := range []uint64{1, 2, 3, 42, 1234, 99991, 7 << 40, 123456789} {
		f.Add(seed, uint8(i), int64(seed*7919), uint16(1440), uint8(2))
		f.Add(seed, uint8(1), int64(46*1<<20+3), uint16(3000), uint8(3)) // New York, near a switch
		f.Add(seed, uint8(2), int64(seed), uint16(600), uint8(0))
	}

	f.Fuzz(func(t *testing.T, seed uint64, zoneIdx uint8, start int64, spanMin uint16, flags uint8) {
		spec, fixed := genSpec(seed)
		zone := fuzzZones[int(zoneIdx)%len(fuzzZones)]
		loc, err := schedule.LoadZone(zone)
		require.NoError(t, err)
		gap := schedule.GapRunAfter
		if flags&1 != 0 {
			gap = schedule.GapSkip
		}
		s, err := schedule.ParseSpec(spec, loc, gap)
		if err != nil {
			require.ErrorContains(t, err, "would never fire", "spec %q", spec)
			return
		}
		require.Equal(t, fixed, s.FixedTime(), "spec %q", spec)

		after := fuzzStart(loc, start, flags&2 != 0)
		until := after.Add(time.Duration(int(spanMin)%(3*24*60)+1) * time.Minute)
		t.Logf("spec %q zone %s gap %s after %s until %s", spec, zone, gap, after.UTC(), until.UTC())

		slots, truncated := s.Slots(after, until, 1<<20)
		require.False(t, truncated)

		// The policy, by brute force.
		require.Equal(t, bruteSlots(t, spec, loc, fixed, gap, after, until), slots)

		// In range, strictly increasing, UTC.
		for i, slot := range slots {
			require.True(t, slot.After(after) && !slot.After(until), "slot %s outside (after, until]", slot)
			require.Equal(t, time.UTC, slot.Location())
			if i > 0 {
				require.True(t, slot.After(slots[i-1]), "slots not strictly increasing at %d", i)
			}
		}

		// Same watermark, same slots: another Spec from the same text agrees.
		again, err := schedule.ParseSpec(spec, loc, gap)
		require.NoError(t, err)
		slotsAgain, _ := again.Slots(after, until, 1<<20)
		require.Equal(t, slots, slotsAgain)

		// Slots is the chain of Next, and Next is consistent at each slot.
		prev := after
		for _, slot := range slots {
			require.Equal(t, slot, s.Next(prev))
			require.Equal(t, slot, s.Next(slot.Add(-time.Nanosecond)))
			prev = slot
		}
		if next := s.Next(prev); !next.IsZero() {
			require.True(t, next.After(until), "Next skipped past a slot before until")
		}

		// Latest agrees with the slots, from every watermark.
		latest, count := s.Latest(after, until)
		require.Equal(t, len(slots), count)
		if count > 0 {
			require.Equal(t, slots[len(slots)-1], latest)
		} else {
			require.True(t, latest.IsZero())
		}
		step := max(1, len(slots)/7)
		for i := 0; i < len(slots); i += step {
			_, count := s.Latest(slots[i], until)
			require.Equal(t, len(slots)-i-1, count)
			latest, count := s.Latest(after, slots[i])
			require.Equal(t, i+1, count)
			require.Equal(t, slots[i], latest)
		}

		// Splitting the range at any watermark changes nothing.
		mid := after.Add(until.Sub(after) * time.Duration(flags>>4) / 16)
		first, _ := s.Slots(after, mid, 1<<20)
		rest, _ := s.Slots(mid, until, 1<<20)
		require.Equal(t, slots, append(first, rest...))

		// Truncation resumes where it stopped.
		if k := int(flags>>2&3) + 1; len(slots) > 0 {
			head, truncated := s.Slots(after, until, k)
			require.Equal(t, len(slots) > k, truncated)
			require.Equal(t, slots[:min(k, len(slots))], head)
		}
	})
}
