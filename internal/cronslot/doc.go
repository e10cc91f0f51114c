// Package cronslot turns a cron spec and a time zone into slots: the instants
// at which a schedule is due. Slots are computed from a watermark alone, so
// every node that asks for the slots after the same watermark gets the same
// instants, which Stepwise stores as UTC timestamps under a unique key.
//
//	ny, err := cronslot.LoadZone("America/New_York")
//	if err != nil {
//		return err
//	}
//	spec, err := cronslot.Parse("30 2 * * *", ny, cronslot.GapRunAfter)
//	if err != nil {
//		return err // cron spec "...": <field>: <what is wrong and the fix>
//	}
//	slot := spec.Next(watermark)             // first slot after the watermark, UTC
//	due, more := spec.Slots(watermark, now, 100) // every slot in (watermark, now]
//	newest, missed := spec.Latest(watermark, now) // for a run-latest misfire policy
//
// # Syntax
//
// Specs use robfig/cron/v3's standard parser: five fields (minute, hour,
// day of month, month, day of week) or a descriptor (@yearly, @annually,
// @monthly, @weekly, @daily, @midnight, @hourly). Day of month and day of week
// combine as in Vixie cron: if either field is '*' a day must match both,
// otherwise either. A "CRON_TZ=Asia/Tokyo " or "TZ=Asia/Tokyo " prefix
// overrides the zone passed to Parse.
//
// @every is refused. robfig/cron counts @every from whenever it is asked, so
// two nodes, or one node before and after a restart, would disagree about the
// slots. Anchoring intervals at the Unix epoch would make them deterministic,
// but then the schedule's zone and DST policy would mean nothing and intervals
// that do not divide a day (@every 7h) would drift across local dates, which
// nobody reading a schedule defined in a zone expects. Every interval that does
// divide an hour or a day has an exact five-field spelling, and the error gives
// it ("@every 15m" is "*/15 * * * *").
//
// # Daylight saving time
//
// robfig/cron's Schedule.Next walks the local clock and lets DST decide: in
// America/New_York it skips "30 2 * * *" entirely on 2026-03-08, when 02:30
// does not exist, and fires "30 1 * * *" twice on 2026-11-01, when 01:30
// happens in EDT and again in EST. A daily settlement must run exactly once per
// local day, so here DST is a policy, Vixie cron's:
//
// A fixed-time spec (minute and hour fields without '*', e.g. "30 2 * * *",
// "0 9,17 * * 1-5", @daily; see Spec.FixedTime) follows the local wall clock.
// Each matching local time is due once, at the first instant the clock shows
// it. A time the clock skips is due at the first instant after the gap
// (GapRunAfter, the default) or not at all (GapSkip); a time the clock shows
// twice is due at its first occurrence only.
//
// A wildcard spec ("0 * * * *", "*/15 * * * *", @hourly) follows absolute
// time: every instant at which the clock shows a matching time is due. An
// hourly job keeps running every 60 minutes through both switches.
//
// New York, 2026 (EST is UTC-5, EDT is UTC-4):
//
//	spec               2026-03-08 (02:00 EST -> 03:00 EDT)    2026-11-01 (02:00 EDT -> 01:00 EST)
//	30 2 * * *         03:00 EDT (GapSkip: none)              02:30 EST
//	30 1 * * *         01:30 EST                              01:30 EDT only
//	15,45 2 * * *      03:00 EDT, once (GapSkip: none)        02:15 EST, 02:45 EST
//	0 0-23 * * *       01:00 EST, 03:00 EDT: 23 slots          01:00 EDT, 02:00 EST: 24 slots
//	0 * * * *          01:00 EST, 03:00 EDT: 23 slots          01:00 EDT, 01:00 EST, 02:00 EST: 25
//	*/30 * * * *       01:30 EST, 03:00 EDT: 46 slots          01:30 EDT, 01:00 EST ... : 50 slots
//	*/15 * * * *       01:45 EST, 03:00 EDT: 92 slots          01:45 EDT, 01:00 EST ... : 100 slots
//
// Slots always strictly increase: when several gap times of one spec meet at
// the end of a gap, or a gap time meets a matching time right after it, they
// are one slot.
//
// # Determinism
//
// Slots depend on the spec, the zone's rules and the watermark, nothing else:
// not on the host's local zone (time.Local is refused), nor on when or where
// the computation runs. The zone rules come from the tz database the process
// loads, so all nodes should carry the same one; importing time/tzdata into
// the service binary pins it to the Go release.
package cronslot
