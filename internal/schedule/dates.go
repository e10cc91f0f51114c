package schedule

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// ErrNoSlotOnDate is matched (errors.Is) by the error SlotOn returns for a date on which the
// spec has no slot: a weekly or monthly spec on another day, or a time the clock skips that
// day under GapSkip.
var ErrNoSlotOnDate = errors.New("no slot on the date")

// ErrSeveralSlotsOnDate is matched (errors.Is) by the error SlotOn returns for a date on which
// the spec has more than one slot: a spec firing several times a day, or a wildcard spec.
var ErrSeveralSlotsOnDate = errors.New("several slots on the date")

// dayMargin widens the instants searched for a date's slots beyond the date in UTC: every
// zone's offset from UTC, historic ones included, is smaller than a day, so each instant whose
// local date is the date lies within the date in UTC, widened by a day either side.
const dayMargin = 24 * time.Hour

// SlotsOn returns the slots whose local date, in the spec's zone, is date's calendar day,
// oldest first, in UTC; none when the spec does not fire that day. Only date's year, month
// and day count, as date.Date() reports them (time.Parse(time.DateOnly, "2026-03-08") is the
// usual way to get one); its clock time and location are ignored.
//
// A slot belongs to the day its zone's wall clock shows when it fires. So DST decides as it
// does for Next (see the package doc): a daily 02:30 in America/New_York has one slot on the
// spring-forward day (03:00, or none under GapSkip) and one on the fall-back day; "0 * * * *"
// has 23 and 25 slots on those days.
//
// SlotsOn and DateOf are inverse: DateOf(slot) is date for each slot returned.
func (s *Spec) SlotsOn(date time.Time) []time.Time {
	day := civilDay(date)
	// Slots takes (after, until]: the second before the widened day's start is excluded.
	slots, _ := s.Slots(day.Add(-dayMargin-time.Second), day.AddDate(0, 0, 1).Add(dayMargin), math.MaxInt)
	out := slots[:0]
	for _, slot := range slots {
		if s.DateOf(slot).Equal(day) {
			out = append(out, slot)
		}
	}
	return out
}

// SlotOn returns the one slot on date (see SlotsOn for what "on" means), in UTC: the slot that
// processes the business date, for a schedule with one slot a day. It is what turns a date
// asked for by hand into the slot to pass to StartSlot, and then the run keys (RunKeys) a tick
// gives the same slot: a date started by hand and by the schedule is one set of runs.
//
// A date with no slot is an error matching ErrNoSlotOnDate; one with several, an error
// matching ErrSeveralSlotsOnDate that lists them (use SlotsOn to take them all). Both errors
// name the spec, its zone and the date. A schedule that processes each date on the following
// day passes date.AddDate(0, 0, 1).
func (s *Spec) SlotOn(date time.Time) (time.Time, error) {
	slots := s.SlotsOn(date)
	switch len(slots) {
	case 1:
		return slots[0], nil
	case 0:
		hint := "no later slot within five years"
		if next := s.firstAfterDate(date); !next.IsZero() {
			hint = fmt.Sprintf("its next slot is %s, on %s", fmtSlot(next), s.DateOf(next).Format(time.DateOnly))
		}
		return time.Time{}, fmt.Errorf("%w: cron spec %q in %s%s has no slot on %s (%s); pick a date the spec fires on, or a spec that fires every day",
			ErrNoSlotOnDate, s.text, s.loc, s.gapNote(), civilDay(date).Format(time.DateOnly), hint)
	default:
		shown := make([]string, 0, 4)
		for i, slot := range slots {
			if i == 3 {
				shown = append(shown, "...")
				break
			}
			shown = append(shown, fmtSlot(slot))
		}
		return time.Time{}, fmt.Errorf("%w: cron spec %q in %s has %d slots on %s (%s), not one; take them all with SlotsOn, or use a spec with one fixed time a day such as \"0 1 * * *\"",
			ErrSeveralSlotsOnDate, s.text, s.loc, len(slots), civilDay(date).Format(time.DateOnly), strings.Join(shown, ", "))
	}
}

// firstAfterDate returns the first slot whose local date is after date's, or the zero Time
// when there is none within five years.
func (s *Spec) firstAfterDate(date time.Time) time.Time {
	day := civilDay(date)
	end := day.AddDate(0, 0, 1).Add(dayMargin)
	slots, _ := s.Slots(day.Add(-dayMargin-time.Second), end, math.MaxInt)
	for _, slot := range slots {
		if s.DateOf(slot).After(day) {
			return slot
		}
	}
	return s.Next(end)
}

func (s *Spec) gapNote() string {
	if s.gap == GapSkip {
		return " (GapSkip)"
	}
	return ""
}

// DateOf returns the local date of slot in the spec's zone, as midnight UTC of that calendar
// day: the value time.Parse(time.DateOnly, ...) gives, and the one SlotsOn and SlotOn take.
// It is the business date a slot belongs to; a schedule that processes each date on the
// following day subtracts one: DateOf(slot).AddDate(0, 0, -1).
func (s *Spec) DateOf(slot time.Time) time.Time {
	return civilDay(slot.In(s.loc))
}

// civilDay returns t's calendar day, as t.Date() reports it, at midnight UTC.
func civilDay(t time.Time) time.Time {
	y, m, d := t.Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// SlotOn returns the one slot of sch on date, as Spec.SlotOn does with the spec sch's Spec,
// Zone and Gap define. With RunKeys(sch.Name, slot, sch.Shards) it gives the keys of the
// date's runs, and with StartSlot(ctx, client, tx, sch, slot, actor) it starts them, the same
// runs the schedule's tick starts for that slot.
func (sch Schedule[A]) SlotOn(date time.Time) (time.Time, error) {
	spec, err := parseScheduleSpec(sch.Name, sch.Spec, sch.Zone, sch.Gap)
	if err != nil {
		return time.Time{}, err
	}
	slot, err := spec.SlotOn(date)
	if err != nil {
		return time.Time{}, fmt.Errorf("schedule %q: %w", sch.Name, err)
	}
	return slot, nil
}

// RunKeys returns the run keys of a slot of a schedule with shards shards, shard 0 first:
// RunKey(schedule, slot, shard) for each shard. A shards below 1 gives none.
func RunKeys(schedule string, slot time.Time, shards int) []string {
	keys := make([]string, 0, max(shards, 0))
	for shard := range max(shards, 0) {
		keys = append(keys, RunKey(schedule, slot, shard))
	}
	return keys
}
