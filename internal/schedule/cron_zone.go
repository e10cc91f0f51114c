package schedule

import (
	"math"
	"strings"
	"time"
	"unicode"
)

// LoadZone loads an IANA time zone such as "America/New_York" or "UTC".
//
// Unlike time.LoadLocation it refuses "" and "Local": both name the host's
// own zone, which differs between nodes, and every node must compute the
// same slots. Errors are *ZoneError and match ErrUnknownZone; a name that is
// wrong only in letter case gets a suggestion.
func LoadZone(name string) (*time.Location, error) {
	if name == "" || name == "Local" {
		return nil, &ZoneError{Name: name}
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		zerr := &ZoneError{Name: name, Err: err}
		if alt := titleZone(name); alt != name {
			if _, altErr := time.LoadLocation(alt); altErr == nil {
				zerr.Suggestion = alt
			}
		}
		return nil, zerr
	}
	return loc, nil
}

// titleZone spells a zone name the way the tz database mostly does
// ("america/new_york" becomes "America/New_York"), for suggestions only.
func titleZone(name string) string {
	var b strings.Builder
	upper := true
	for _, r := range name {
		if upper {
			b.WriteRune(unicode.ToUpper(r))
		} else {
			b.WriteRune(unicode.ToLower(r))
		}
		upper = r == '/' || r == '_' || r == '-'
	}
	return b.String()
}

// Sentinels for a zone period that has no start or no end. A quarter of the
// int64 range leaves room to add offsets and a day without overflow.
const (
	minSec = math.MinInt64 / 4
	maxSec = math.MaxInt64 / 4
)

// period is a stretch of absolute time over which a zone keeps one UTC
// offset: instants [start, end) in Unix seconds, local wall clock =
// instant + offset.
type period struct {
	start, end int64
	offset     int64
}

// periodAt returns a stretch of constant offset holding the instant sec:
// start <= sec < end. Walks over periods use only the end going forward and
// only the start going backward, and clamp each period to where the walk
// stands, so a boundary that is not a real transition (time.Time.ZoneBounds
// also reports year ends and other same-offset splits) costs nothing.
func periodAt(loc *time.Location, sec int64) period {
	p := zoneBounds(loc, sec)
	for day := int64(1); p.end <= sec && day <= 3; day++ {
		// golang/go#81583: in years served by a zone's TZ rule (after its
		// last listed transition, e.g. Berlin in 2056), the period that runs
		// to the end of a leap year reports its end as Dec 31 00:00 UTC, a
		// day early, even for instants on Dec 31. The next period's start
		// is right, and the offset up to it is this period's.
		p.end = zoneBounds(loc, sec+day*secPerDay).start
	}
	if p.end <= sec {
		p.end = sec + 1 // never stall, whatever the zone data says
	}
	p.start = min(p.start, sec)
	return p
}

// zoneBounds is time.Time.ZoneBounds in Unix seconds, with sentinels for a
// period without start or end.
func zoneBounds(loc *time.Location, sec int64) period {
	t := time.Unix(sec, 0).In(loc)
	_, off := t.Zone()
	start, end := t.ZoneBounds()
	p := period{start: minSec, end: maxSec, offset: int64(off)}
	if !start.IsZero() {
		p.start = start.Unix()
	}
	if !end.IsZero() {
		p.end = end.Unix()
	}
	return p
}

// lookback bounds how far back wallsSeenBefore looks for a clock that ran
// ahead of the current period. No zone has fallen back by anything close to
// two days in the era this package serves.
const lookback = 2 * secPerDay

// wallsSeenBefore returns the exclusive upper bound of the local wall-clock
// readings shown before the instant start: every wall time below it has
// already happened. After a fall-back it is above start's own wall time,
// which is how a repeated local time is recognised as a repeat; after a
// spring-forward it is below, and the walls in between were skipped.
func wallsSeenBefore(loc *time.Location, start int64) int64 {
	seen := int64(minSec)
	for bound := start; bound > minSec; {
		q := periodAt(loc, bound-1)
		seen = max(seen, min(q.end, bound)+q.offset)
		if q.start < start-lookback {
			break
		}
		bound = q.start
	}
	return seen
}
