package schedule

import (
	"fmt"
	"time"
)

// GapPolicy says what happens to a fixed local time that falls in a
// spring-forward gap, such as 02:30 in America/New_York on 2026-03-08. It
// matters only for fixed-time specs (see Spec.FixedTime).
type GapPolicy int

const (
	// GapRunAfter runs a local time that falls in a gap once, at the first
	// instant after the gap (03:00 EDT for New York), as Vixie cron does.
	// Several gap times of one spec on one day share that one slot. This is
	// the default: a daily job still runs that day.
	GapRunAfter GapPolicy = iota

	// GapSkip drops a local time that falls in a gap: no slot for it that
	// day.
	GapSkip
)

// String returns "GapRunAfter" or "GapSkip".
func (g GapPolicy) String() string {
	switch g {
	case GapRunAfter:
		return "GapRunAfter"
	case GapSkip:
		return "GapSkip"
	}
	return fmt.Sprintf("GapPolicy(%d)", int(g))
}

// Spec is a parsed cron spec bound to a time zone and a gap policy. It
// computes slots, the instants at which the schedule is due. A Spec is
// immutable and safe for concurrent use.
//
// All methods take and return instants; slots are returned in UTC. Slots
// fall on whole seconds, so a sub-second part of an argument only matters
// for strictness: a slot at 09:00:00 is not "after" 09:00:00.5.
type Spec struct {
	text  string
	loc   *time.Location
	gap   GapPolicy
	fixed bool
	cal   calendar
}

// ParseSpec parses a cron spec in robfig/cron's standard syntax: five fields
// "minute hour day-of-month month day-of-week" (names such as "jan" and
// "mon" allowed, '?' as '*'), or one of the descriptors @yearly, @annually,
// @monthly, @weekly, @daily, @midnight and @hourly. A leading "CRON_TZ=zone"
// or "TZ=zone" overrides zone; otherwise zone is required, and must not be
// time.Local, which differs between hosts.
//
// @every is refused: its slots would depend on when a process started. The
// error gives the equivalent fields when there are some ("@every 15m" is
// "*/15 * * * *").
//
// ParseSpec also refuses a spec that can never fire ("0 0 30 2 *") and a gap
// policy it does not know. Errors are *SpecError, match ErrInvalidSpec, and
// read like
//
//	cron spec "61 * * * *": minute field: value 61 out of range 0-59
func ParseSpec(spec string, zone *time.Location, gap GapPolicy) (*Spec, error) {
	return parse(spec, zone, gap)
}

// String returns the spec as given to ParseSpec, without surrounding spaces.
func (s *Spec) String() string { return s.text }

// Location returns the zone the spec is evaluated in: the CRON_TZ= or TZ=
// prefix if there was one, else the zone given to ParseSpec.
func (s *Spec) Location() *time.Location { return s.loc }

// FixedTime reports whether the spec names fixed local times: neither the
// minute nor the hour field has a part starting with '*' or '?'. "30 2 * * *",
// "0 9,17 * * 1-5", "0 0-23/6 * * *" and @daily are fixed; "0 * * * *",
// "*/15 9-17 * * *", "30 */2 * * *" and @hourly are not (they are
// "wildcard" specs). This is Vixie cron's rule.
//
// Fixed-time specs follow the local wall clock: each matching local time
// runs once, at the first instant the clock shows it (or, under GapRunAfter,
// jumps past it). Wildcard specs follow absolute time: every instant at which
// the clock shows a matching time is a slot, so an hourly spec has two slots
// in a repeated hour and none in a skipped one.
func (s *Spec) FixedTime() bool { return s.fixed }

// Next returns the first slot strictly after after, in UTC, or the zero Time
// when there is none within five years (possible only for day 29 of
// February across a century year such as 2100).
//
// Chaining Next from a watermark gives the same slots on every node.
func (s *Spec) Next(after time.Time) time.Time {
	a := unix(after)
	limit := max(unix(after.AddDate(5, 0, 0)), a)
	if slot, ok := s.next(a, limit); ok {
		return time.Unix(slot, 0).UTC()
	}
	return time.Time{}
}

// Slots returns the slots in (after, until], oldest first, in UTC, at most
// maxSlots of them. truncated reports that more slots remain after the last
// one returned; continue with Slots(last, until, maxSlots). A maxSlots below
// 1 returns no slots and reports whether there are any.
func (s *Spec) Slots(after, until time.Time, maxSlots int) (slots []time.Time, truncated bool) {
	a, u := unix(after), unix(until)
	for {
		slot, ok := s.next(a, u)
		if !ok {
			return slots, false
		}
		if len(slots) >= maxSlots {
			return slots, true
		}
		slots = append(slots, time.Unix(slot, 0).UTC())
		a = slot
	}
}

// Latest returns the newest slot in (after, until] and how many slots that
// range holds, the newest included, or the zero Time and 0 when it holds
// none. It is what a run-latest misfire policy needs: one slot to run, and
// count-1 older ones to record as skipped.
//
// Neither result is found by walking the slots: the cost grows with the
// days and zone transitions in the range, so a per-minute spec after a
// 30-day outage (43,200 slots) costs about as much as a daily one.
func (s *Spec) Latest(after, until time.Time) (latest time.Time, count int) {
	a, u := unix(after), unix(until)
	if u <= a {
		return time.Time{}, 0
	}
	last, ok := s.prev(a, u)
	if !ok {
		return time.Time{}, 0
	}
	return time.Unix(last, 0).UTC(), s.count(a, last)
}

// Slots exist only in years 1 to 9999; arguments outside are clamped to
// that span, which keeps all arithmetic far from overflow.
var (
	minUnix = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	maxUnix = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC).Unix()
)

// unix returns t's whole Unix seconds, rounded down and clamped to years 1
// to 9999. Slots are whole seconds, so slot > t exactly when slot > unix(t),
// and slot <= t exactly when slot <= unix(t).
func unix(t time.Time) int64 {
	return min(max(t.Unix(), minUnix-1), maxUnix)
}

// A slot is defined over stretches of constant offset (periods, see
// zone.go). Inside one, with offset o, the wall clock reads instant+o, and:
//
//   - for a wildcard spec, the slots are the instants w-o for every matching
//     wall time w the stretch shows;
//   - for a fixed-time spec, the same, except that a wall time below seen
//     (the clock showed it before the stretch began, i.e. it is the repeat
//     after a fall-back) is not a slot again; and under GapRunAfter the
//     stretch's first instant is a slot if the clock jumped over a matching
//     wall time there (a spring-forward gap).
//
// window computes, for the stretch [start, end), the wall-time range
// [lo, hi) whose matches are slots in (after, until], and whether start is a
// gap slot. A stretch may begin anywhere inside a period: then seen equals
// start's own wall time, and there is neither a repeat nor a gap. next,
// prev and count only walk stretches and combine windows.
type window struct {
	lo, hi  int64 // wall times; slot = wall - offset
	offset  int64
	start   int64 // the stretch's first instant
	gapSlot bool  // start is a slot because the clock jumped over a match
}

func (s *Spec) window(start, end, offset, after, until int64) window {
	w := window{
		lo:     max(start, after+1) + offset,
		hi:     min(end, until+1) + offset,
		offset: offset,
		start:  start,
	}
	if !s.fixed || start <= minSec {
		return w
	}
	seen := wallsSeenBefore(s.loc, start)
	// After a fall-back the clock repeats wall times it already showed; a
	// fixed time ran at its first occurrence, so a daily job runs once.
	w.lo = max(w.lo, seen)
	// After a spring-forward the clock never shows [seen, start+offset).
	if gapEnd := start + offset; s.gap == GapRunAfter && seen < gapEnd && after < start && start <= until {
		_, w.gapSlot = s.cal.first(seen, gapEnd)
	}
	return w
}

// next returns the first slot in (after, until].
func (s *Spec) next(after, until int64) (int64, bool) {
	for t := after + 1; t <= until; {
		p := periodAt(s.loc, t)
		w := s.window(t, p.end, p.offset, after, until)
		if w.gapSlot {
			return w.start, true // the stretch's earliest instant
		}
		if wall, ok := s.cal.first(w.lo, w.hi); ok {
			return wall - w.offset, true
		}
		if p.end >= maxSec {
			break
		}
		t = p.end
	}
	return 0, false
}

// prev returns the last slot in (after, until].
func (s *Spec) prev(after, until int64) (int64, bool) {
	for end := until + 1; end > after+1; {
		p := periodAt(s.loc, end-1)
		w := s.window(p.start, end, p.offset, after, until)
		if wall, ok := s.cal.last(w.lo, w.hi); ok {
			return wall - w.offset, true
		}
		if w.gapSlot {
			return w.start, true
		}
		if p.start <= minSec {
			break
		}
		end = p.start
	}
	return 0, false
}

// count returns the number of slots in (after, until].
func (s *Spec) count(after, until int64) int {
	n := 0
	for t := after + 1; t <= until; {
		p := periodAt(s.loc, t)
		w := s.window(t, p.end, p.offset, after, until)
		n += s.cal.count(w.lo, w.hi)
		if w.gapSlot {
			// The gap slot coincides with an exact one when the wall time
			// right after the gap matches too; count that instant once.
			if first, ok := s.cal.first(w.lo, w.hi); !ok || first != w.start+w.offset {
				n++
			}
		}
		if p.end >= maxSec {
			break
		}
		t = p.end
	}
	return n
}
