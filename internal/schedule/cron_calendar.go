package schedule

import (
	"math/bits"
	"time"
)

const (
	secPerMin  = 60
	secPerHour = 60 * secPerMin
	secPerDay  = 24 * secPerHour
)

// calendar is a parsed spec's field sets, matched against wall times.
//
// A wall time is a local date and time of day written as seconds since
// 1970-01-01 00:00 on a clock with no zone and no daylight saving time: day
// arithmetic is exact, and a wall time that never appears on a real clock
// (or appears twice) is still one number. Everything about zones lives in
// spec.go; this file only answers "which wall times match".
type calendar struct {
	minute, hour, dom, month, dow uint64 // bit i set: value i selected

	// domStar and dowStar record a '*' (or '?') in the day-of-month or
	// day-of-week field, as robfig/cron does: when either is set a day must
	// match both fields, otherwise either one (Vixie cron's rule).
	domStar, dowStar bool
}

// dayMatches reports whether the wall day (days since 1970-01-01) matches
// the month, day-of-month and day-of-week fields.
func (c *calendar) dayMatches(day int64) bool {
	t := time.Unix(day*secPerDay, 0).UTC()
	_, month, dom := t.Date()
	if c.month&(1<<uint(month)) == 0 {
		return false
	}
	domOK := c.dom&(1<<uint(dom)) != 0
	dowOK := c.dow&(1<<uint(t.Weekday())) != 0
	if c.domStar || c.dowStar {
		return domOK && dowOK
	}
	return domOK || dowOK
}

// first returns the earliest matching wall time w with lo <= w < hi.
// Its cost grows with the number of days in the range, not with the
// number of matches.
func (c *calendar) first(lo, hi int64) (int64, bool) {
	if lo >= hi {
		return 0, false
	}
	day := floorDiv(lo, secPerDay)
	tod := lo - day*secPerDay
	for ; day*secPerDay < hi; day, tod = day+1, 0 {
		if !c.dayMatches(day) {
			continue
		}
		if t, ok := c.firstInDay(tod); ok {
			if w := day*secPerDay + t; w < hi {
				return w, true
			}
			return 0, false
		}
	}
	return 0, false
}

// firstInDay returns the earliest matching time of day at or after tod
// (seconds since midnight, 0 <= tod < secPerDay).
func (c *calendar) firstInDay(tod int64) (int64, bool) {
	h0 := tod / secPerHour
	for h := h0; h < 24; h++ {
		if c.hour&(1<<uint(h)) == 0 {
			continue
		}
		var from int64
		if h == h0 {
			from = ceilDiv(tod-h*secPerHour, secPerMin)
		}
		if mins := c.minute &^ (1<<uint(from) - 1); mins != 0 {
			return h*secPerHour + int64(bits.TrailingZeros64(mins))*secPerMin, true
		}
	}
	return 0, false
}

// last returns the latest matching wall time w with lo <= w < hi.
func (c *calendar) last(lo, hi int64) (int64, bool) {
	if lo >= hi {
		return 0, false
	}
	day := floorDiv(hi-1, secPerDay)
	tod := hi - 1 - day*secPerDay
	for ; (day+1)*secPerDay > lo; day, tod = day-1, secPerDay-1 {
		if !c.dayMatches(day) {
			continue
		}
		if t, ok := c.lastInDay(tod); ok {
			if w := day*secPerDay + t; w >= lo {
				return w, true
			}
			return 0, false
		}
	}
	return 0, false
}

// lastInDay returns the latest matching time of day at or before tod.
func (c *calendar) lastInDay(tod int64) (int64, bool) {
	h0 := tod / secPerHour
	for h := h0; h >= 0; h-- {
		if c.hour&(1<<uint(h)) == 0 {
			continue
		}
		to := int64(59)
		if h == h0 {
			to = (tod - h*secPerHour) / secPerMin
		}
		if mins := c.minute & (1<<uint(to+1) - 1); mins != 0 {
			return h*secPerHour + int64(63-bits.LeadingZeros64(mins))*secPerMin, true
		}
	}
	return 0, false
}

// count returns how many matching wall times w have lo <= w < hi, in time
// proportional to the number of days in the range.
func (c *calendar) count(lo, hi int64) int {
	if lo >= hi {
		return 0
	}
	perDay := bits.OnesCount64(c.hour) * bits.OnesCount64(c.minute)
	n := 0
	for day := floorDiv(lo, secPerDay); day*secPerDay < hi; day++ {
		if !c.dayMatches(day) {
			continue
		}
		from := max(lo-day*secPerDay, 0)
		to := min(hi-day*secPerDay, secPerDay)
		if from == 0 && to == secPerDay {
			n += perDay
			continue
		}
		n += c.countInDay(from, to)
	}
	return n
}

// countInDay counts matching times of day t with from <= t < to.
func (c *calendar) countInDay(from, to int64) int {
	n := 0
	for h := int64(0); h < 24; h++ {
		if c.hour&(1<<uint(h)) == 0 {
			continue
		}
		a := clamp(ceilDiv(from-h*secPerHour, secPerMin), 0, 60)
		b := clamp(ceilDiv(to-h*secPerHour, secPerMin), 0, 60)
		if a < b {
			n += bits.OnesCount64(c.minute & (1<<uint(b) - 1) &^ (1<<uint(a) - 1))
		}
	}
	return n
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func ceilDiv(a, b int64) int64 { return -floorDiv(-a, b) }

func clamp(v, lo, hi int64) int64 { return min(max(v, lo), hi) }
