package schedule

import (
	"fmt"
	"slices"
	"time"
)

// slotAction is what a tick does with one slot.
type slotAction int

const (
	actMaterialize slotAction = iota // a new slot: record it and start its runs
	actSkip                          // a new slot: record it as skipped
	actBuffer                        // a new slot: record it as waiting for earlier runs
	actPromote                       // a buffered slot whose turn has come: start its runs
	actSupersede                     // a buffered slot overtaken by a newer one: now skipped
)

// Reasons recorded on skipped slots (stepwise_schedule_slot.reason). They are stable codes:
// operators filter on them and metrics use them as labels.
const (
	ReasonCatchUpLimit      = "catch_up_limit"      // CatchUpAll: more than Max slots were waiting
	ReasonMisfireRunLatest  = "misfire_run_latest"  // RunLatest: a newer slot was due too
	ReasonMisfireDeadline   = "misfire_deadline"    // SkipMissed: later than StartingDeadline
	ReasonOverlapSkip       = "overlap_skip"        // OverlapSkip: earlier runs unfinished
	ReasonOverlapBufferFull = "overlap_buffer_full" // OverlapBufferOne: a slot already waits
	ReasonOverlapSuperseded = "overlap_superseded"  // OverlapCancelOther: a newer slot came
)

type slotDecision struct {
	slot   time.Time
	action slotAction
	reason string // for actSkip and actSupersede
	detail string
}

// openSlot is a slot still in flight when a tick begins: buffered, or materialized with
// runs not all finished.
type openSlot struct {
	slot     time.Time
	buffered bool
}

type tickPlan struct {
	decisions []slotDecision
	// cancel lists materialized slots whose unfinished runs must be asked to stop.
	cancel []time.Time
	// watermark is the newest slot decided, or the old watermark if none was.
	watermark time.Time
}

func fmtSlot(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// planTick decides, without touching the database, what a tick does: which due slots in
// (watermark, now] are materialized, skipped or buffered, which buffered slots start and
// which runs are asked to stop. It is a pure function of the schedule's definition, its
// watermark, the clock, the slots in flight and the slots after the watermark already
// decided (by hand, StartSlot), which is what makes two ticks from the same watermark agree
// (FuzzPlanTick) and lets a tick be repeated after a crash. At most maxSlots new slots are
// decided; the rest wait for the next tick, which continues from the new watermark.
//
// A slot in decided gets no decision: the watermark passes over it. Guards against: a slot
// started by hand ahead of its tick being decided again by the policies, recorded SKIPPED
// while its runs run. A slot started by hand that is still in flight is in open like any
// other, so the overlap policy counts it.
func planTick(def *schedule, watermark, now time.Time, open []openSlot, decided []time.Time, maxSlots int) tickPlan {
	p := tickPlan{watermark: watermark}
	var busy, buffered []time.Time
	for _, o := range open {
		if o.buffered {
			buffered = append(buffered, o.slot)
		} else {
			busy = append(busy, o.slot)
		}
	}
	decide := func(slot time.Time, a slotAction, reason, detail string) {
		p.decisions = append(p.decisions, slotDecision{slot: slot, action: a, reason: reason, detail: detail})
	}

	// Buffered slots go first: they are older than anything due now, and under
	// OverlapBufferAll their order is the promise.
	for len(buffered) > 0 && (len(busy) == 0 || def.overlap == OverlapAllowAll) {
		decide(buffered[0], actPromote, "", "")
		busy = append(busy, buffered[0])
		buffered = buffered[1:]
	}

	due, stop := misfire(def, watermark, now, decided, maxSlots, &p)
	if stop {
		return p
	}

	// Under OverlapCancelOther only the newest slot due in this tick can survive: each newer
	// slot would cancel the one before it. Skipping the older ones here avoids starting runs
	// only to cancel them in the same transaction.
	if def.overlap == OverlapCancelOther && len(due) > 1 {
		newest := due[len(due)-1]
		for _, slot := range due[:len(due)-1] {
			decide(slot, actSkip, ReasonOverlapSuperseded, fmt.Sprintf("slot %s was due in the same tick; OverlapCancelOther keeps the newest", fmtSlot(newest)))
		}
		due = due[len(due)-1:]
	}

	for _, slot := range due {
		switch def.overlap {
		case OverlapAllowAll:
			decide(slot, actMaterialize, "", "")
			busy = append(busy, slot)
		case OverlapSkip:
			if len(busy) > 0 || len(buffered) > 0 {
				decide(slot, actSkip, ReasonOverlapSkip, fmt.Sprintf("runs of slot %s were unfinished (OverlapSkip)", fmtSlot(latestOf(busy, buffered))))
				continue
			}
			decide(slot, actMaterialize, "", "")
			busy = append(busy, slot)
		case OverlapBufferOne:
			switch {
			case len(busy) == 0 && len(buffered) == 0:
				decide(slot, actMaterialize, "", "")
				busy = append(busy, slot)
			case len(buffered) == 0:
				decide(slot, actBuffer, "", fmt.Sprintf("waiting for the runs of slot %s", fmtSlot(busy[len(busy)-1])))
				buffered = append(buffered, slot)
			default:
				decide(slot, actSkip, ReasonOverlapBufferFull, fmt.Sprintf("slot %s was already waiting (OverlapBufferOne keeps one)", fmtSlot(buffered[0])))
			}
		case OverlapBufferAll:
			if len(busy) == 0 && len(buffered) == 0 {
				decide(slot, actMaterialize, "", "")
				busy = append(busy, slot)
				continue
			}
			decide(slot, actBuffer, "", fmt.Sprintf("waiting for the runs of slot %s", fmtSlot(latestOf(busy, buffered))))
			buffered = append(buffered, slot)
		case OverlapCancelOther:
			if later := latestOf(busy, nil); later.After(slot) {
				// A later slot is in flight already (started by hand ahead of its tick):
				// the newest wins, and that is not this one.
				decide(slot, actSkip, ReasonOverlapSuperseded, fmt.Sprintf("slot %s, a later one, was already started (OverlapCancelOther keeps the newest)", fmtSlot(later)))
				continue
			}
			for _, b := range buffered {
				decide(b, actSupersede, ReasonOverlapSuperseded, fmt.Sprintf("superseded by slot %s before it started (OverlapCancelOther)", fmtSlot(slot)))
			}
			buffered = nil
			if len(busy) == 0 {
				decide(slot, actMaterialize, "", "")
				busy = append(busy, slot)
				continue
			}
			// Start the new slot only once the old runs have ended, so the two never
			// work at once: cancellation is cooperative and takes up to a heartbeat.
			p.cancel = append(p.cancel, busy...)
			decide(slot, actBuffer, "", fmt.Sprintf("waiting for the cancelled runs of slot %s to end", fmtSlot(busy[len(busy)-1])))
			buffered = append(buffered, slot)
		}
	}
	return p
}

// misfire applies the schedule's misfire policy to the slots in (watermark, now]: it records
// the skipped ones in p and returns the ones to run, oldest first. Slots in decided are
// neither skipped nor returned, but the watermark passes them. stop reports that the tick's
// budget of maxSlots is used up by skipped slots; the next tick continues.
func misfire(def *schedule, watermark, now time.Time, decided []time.Time, maxSlots int, p *tickPlan) (run []time.Time, stop bool) {
	isDecided := func(slot time.Time) bool {
		return slices.ContainsFunc(decided, func(d time.Time) bool { return d.Equal(slot) })
	}
	latest, count := def.spec.Latest(watermark, now)
	if count == 0 {
		return nil, false
	}
	budget := maxSlots
	after := watermark
	// skipOldest records the n oldest remaining slots (at most until) as skipped.
	skipOldest := func(n int, until time.Time, reason string, detail func(time.Time) string) bool {
		take := min(n, budget)
		slots, _ := def.spec.Slots(after, until, take)
		for _, slot := range slots {
			if !isDecided(slot) {
				p.decisions = append(p.decisions, slotDecision{slot: slot, action: actSkip, reason: reason, detail: detail(slot)})
			}
			after = slot
		}
		budget -= len(slots)
		p.watermark = after
		return take < n || budget == 0
	}

	switch m := def.misfire.(type) {
	case CatchUpAll:
		if excess := count - m.Max; excess > 0 {
			detail := func(time.Time) string {
				return fmt.Sprintf("%d slots were waiting and CatchUpAll.Max is %d; the oldest are skipped", count, m.Max)
			}
			if skipOldest(excess, now, ReasonCatchUpLimit, detail) {
				return nil, true
			}
		}
		run, _ = def.spec.Slots(after, now, min(m.PerTick, budget))
	case RunLatest:
		if older := count - 1; older > 0 {
			detail := func(time.Time) string {
				return fmt.Sprintf("missed; RunLatest runs only the newest missed slot, %s", fmtSlot(latest))
			}
			if skipOldest(older, latest.Add(-time.Second), ReasonMisfireRunLatest, detail) {
				return nil, true
			}
		}
		run = []time.Time{latest}
	case SkipMissed:
		// A slot exactly StartingDeadline old still runs; one a nanosecond older does not.
		cutoff := now.Add(-m.StartingDeadline).Add(-time.Nanosecond)
		if _, n := def.spec.Latest(after, cutoff); n > 0 {
			detail := func(slot time.Time) string {
				return fmt.Sprintf("decided %s after its time, past SkipMissed.StartingDeadline %s", now.Sub(slot).Round(time.Second), m.StartingDeadline)
			}
			if skipOldest(n, cutoff, ReasonMisfireDeadline, detail) {
				return nil, true
			}
		}
		run, _ = def.spec.Slots(after, now, budget)
	default:
		panic(fmt.Sprintf("schedule: unknown misfire policy %T", def.misfire)) // Add admits only the three
	}
	if len(run) > 0 {
		p.watermark = run[len(run)-1]
	}
	return slices.DeleteFunc(run, isDecided), false
}

func latestOf(a, b []time.Time) time.Time {
	var t time.Time
	for _, s := range append(append([]time.Time(nil), a...), b...) {
		if s.After(t) {
			t = s
		}
	}
	return t
}
