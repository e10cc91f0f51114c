package schedule

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var fuzzZones = []string{"UTC", "America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kolkata", "America/Santiago", "Pacific/Chatham"}

// fuzzSpec builds a valid-looking cron spec from fuzz input; specs ParseSpec refuses are
// skipped by the caller.
func fuzzSpec(minute, hour, dom, dow uint8) string {
	mins := []string{"*", fmt.Sprintf("*/%d", minute%30+1), fmt.Sprint(minute % 60), fmt.Sprintf("%d,%d", minute%60, (minute+17)%60)}
	hours := []string{"*", fmt.Sprint(hour % 24), fmt.Sprintf("*/%d", hour%12+1), fmt.Sprintf("%d-%d", hour%12, hour%12+(hour%7)+5), "1,2,3"}
	doms := []string{"*", fmt.Sprint(dom%28 + 1), "1,15"}
	dows := []string{"*", fmt.Sprint(dow % 7), "1-5"}
	return fmt.Sprintf("%s %s %s * %s", mins[int(minute)%len(mins)], hours[int(hour)%len(hours)], doms[int(dom)%len(doms)], dows[int(dow)%len(dows)])
}

// FuzzPlanTick checks, for random specs, zones, watermarks, clocks and policies, that two
// ticks planning from the same watermark decide exactly the same slots, and that the slots
// decided are exactly the head of the chain spec.Next(watermark), spec.Next(...), ... (no
// slot skipped over, none invented, none past the clock).
func FuzzPlanTick(f *testing.F) {
	f.Add(uint8(0), uint8(2), uint8(0), uint8(0), uint8(1), int64(1772900000), uint32(200000), uint8(0), uint8(0), uint16(50), uint8(0))
	f.Add(uint8(30), uint8(1), uint8(0), uint8(0), uint8(1), int64(1793400000), uint32(200000), uint8(1), uint8(3), uint16(3), uint8(2))
	f.Add(uint8(5), uint8(0), uint8(1), uint8(2), uint8(3), int64(1700000000), uint32(36000), uint8(2), uint8(4), uint16(10), uint8(5))
	f.Fuzz(func(t *testing.T, minute, hour, dom, dow, zoneIdx uint8, watermarkUnix int64, span uint32, misfireKind, overlap uint8, perTick uint16, openN uint8) {
		spec := fuzzSpec(minute, hour, dom, dow)
		zone := fuzzZones[int(zoneIdx)%len(fuzzZones)]
		var m MisfirePolicy
		switch misfireKind % 3 {
		case 0:
			m = CatchUpAll{Max: int(perTick%500) + 1, PerTick: int(perTick%97) + 1}
		case 1:
			m = RunLatest{}
		case 2:
			m = SkipMissed{StartingDeadline: time.Duration(perTick%3600+6) * time.Second}
		}
		def, err := compileSchedule(Schedule[planArgs]{
			Name: "fuzz", Spec: spec, Zone: zone, Misfire: m, Overlap: OverlapPolicy(overlap%5) + 1, Shards: 1,
			Args: func(time.Time, int) planArgs { return planArgs{} },
		}, 5*time.Second)
		if err != nil {
			return // a spec ParseSpec refuses (FuzzParse fuzzes the parser itself)
		}
		// Keep the instants in 1970..2100 and the window within about 30 days.
		watermark := time.Unix(1+(watermarkUnix%4_100_000_000+4_100_000_000)%4_100_000_000, 0).UTC()
		now := watermark.Add(time.Duration(span%2_600_000) * time.Second)
		var open []openSlot
		for i := range int(openN % 4) {
			open = append(open, openSlot{slot: watermark.Add(-time.Duration(i+1) * time.Minute), buffered: i%2 == 1})
		}
		maxSlots := int(perTick%200) + 1

		a := planTick(def, watermark, now, open, nil, maxSlots)
		b := planTick(def, watermark, now, open, nil, maxSlots)
		require.True(t, reflect.DeepEqual(a, b), "two ticks from the same watermark disagree:\n%+v\n%+v", a, b)

		// The new slots decided are the chain from the watermark, in order, within the
		// clock and the budget, and the watermark moves to the last of them.
		prev := watermark
		n := 0
		for _, d := range a.decisions {
			if d.action == actPromote || d.action == actSupersede {
				continue // slots from before the watermark
			}
			require.Equal(t, def.spec.Next(prev), d.slot, "spec %q zone %s: decided %s after %s", spec, zone, d.slot, prev)
			require.False(t, d.slot.After(now), "slot %s decided before its time %s", d.slot, now)
			prev = d.slot
			n++
		}
		require.LessOrEqual(t, n, maxSlots)
		require.Equal(t, prev, a.watermark)
		if n == 0 {
			// Nothing decided: either nothing is due, or the budget forbade it.
			if next := def.spec.Next(watermark); !next.IsZero() && !next.After(now) {
				require.Fail(t, "a due slot was not decided", "spec %q zone %s next %s now %s", spec, zone, next, now)
			}
		}
	})
}
