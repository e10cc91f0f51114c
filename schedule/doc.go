// Package schedule turns cron specs into durable, deterministic slots, each fanned out to one run per
// shard. River's own periodic jobs keep their state in the leader's memory, so a slot that
// falls due during a deploy or a leader change is lost; a Stepwise schedule keeps a
// watermark (the last slot decided) in stepwise_schedule and advances it only in the
// transaction that inserts the slot's runs and River jobs. A tick that commits and then
// crashes leaves nothing to redo; a tick that crashes before commit leaves nothing done.
//
// # Slots
//
// The slots of a schedule are the chain spec.Next(previous) in the schedule's zone, stored
// as UTC timestamps (Spec does the arithmetic, DST included), so every
// node computes the same instants. Each slot is decided exactly once, under the schedule
// row's lock, and recorded in stepwise_schedule_slot as materialized, skipped (with a reason)
// or buffered (waiting for the previous slot's runs to finish). A materialized slot has one
// run per shard with key "<schedule>/<slot RFC 3339 UTC>/<shard>" (RunKey); run keys
// are unique forever, so even a tick that somehow ran twice could not start a second run.
//
// # Misfires
//
// Slots missed while no tick ran (an outage, a long deploy, a paused schedule) are decided
// by the schedule's MisfirePolicy when ticking resumes: CatchUpAll runs them (bounded in
// count and rate), RunLatest runs only the newest, SkipMissed runs none older than a
// starting deadline. Every slot not run is recorded as skipped with its reason.
//
// # Overlap
//
// When a slot is due while runs of an earlier slot are unfinished, the OverlapPolicy
// decides: OverlapAllowAll, OverlapSkip, OverlapBufferOne, OverlapBufferAll (strictly serial,
// in slot order) or OverlapCancelOther (cooperative cancellation of the older runs, as
// stepwise.Client.RunCancel does; the new slot starts once they have ended).
//
// # Batch status
//
// stepwise.Client.SlotGet and SlotList derive a slot's status from evidence (its runs and
// the operations they enqueued), never from a loop that merely returned: see BatchStatus.
//
// # Example
//
// A service lists its schedules in stepwise.Config.Schedules; stepwise.Client registers
// them, installs the tick job and ticks in every process's maintenance loop (never only on
// River's leader):
//
//	client, err := stepwise.NewClient(pool, &stepwise.Config{
//		River: riverConfig, // with a worker for SettleArgs (stepwise.AddWorker)
//		Schedules: []stepwise.Schedule{
//			schedule.Schedule[SettleArgs]{
//				Name:    "settle",
//				Spec:    "30 2 * * *",
//				Zone:    "America/New_York",
//				Misfire: schedule.CatchUpAll{Max: 30, PerTick: 5},
//				Overlap: schedule.OverlapBufferAll,
//				Shards:  8,
//				Args: func(slot time.Time, shard int) SettleArgs {
//					return SettleArgs{Date: slot.In(ny).Format(time.DateOnly), Shard: shard}
//				},
//			},
//		},
//	})
//
// Register the same schedules on every node: the tick job runs on whichever node fetches it,
// and ticks only the schedules that node knows. StartSlot starts a slot's runs by hand and
// records the slot's decision with them, naming who started it (the tick that reaches the
// slot then passes over it, and the overlap policy counts it while its runs are unfinished).
// The client's ScheduleGet, SchedulePause, SlotList and SlotGet are the operator's side.
//
// # Cron specs
//
// ParseSpec turns a cron spec and a time zone into a Spec, which computes slots from a
// watermark alone, so every node that asks for the slots after the same watermark gets the
// same instants:
//
//	ny, err := schedule.LoadZone("America/New_York")
//	if err != nil {
//		return err
//	}
//	spec, err := schedule.ParseSpec("30 2 * * *", ny, schedule.GapRunAfter)
//	if err != nil {
//		return err // cron spec "...": <field>: <what is wrong and the fix>
//	}
//	slot := spec.Next(watermark)                  // first slot after the watermark, UTC
//	due, more := spec.Slots(watermark, now, 100)  // every slot in (watermark, now]
//	newest, missed := spec.Latest(watermark, now) // for a run-latest misfire policy
//
// # Business dates
//
// A date is a local day in the schedule's zone, not a UTC one: a 00:30 slot in Asia/Tokyo
// falls on the previous UTC day. Spec.DateOf gives a slot's date (use it in Args), and
// Spec.SlotOn, or Schedule.SlotOn, the one slot on a date, for starting a date by hand with
// StartSlot under the keys the tick uses (RunKeys); SlotsOn gives every slot of a date. A
// date without a slot, or with several, is an error that says so (ErrNoSlotOnDate,
// ErrSeveralSlotsOnDate):
//
//	date, err := time.Parse(time.DateOnly, "2026-03-07") // the date to re-run
//	slot, err := sch.SlotOn(date)                        // its slot, DST included
//	runs, err := schedule.StartSlot(ctx, client, tx, sch, slot, "ana")
//	keys := schedule.RunKeys(sch.Name, slot, sch.Shards) // the same runs, from anywhere
//
// A schedule that settles each date on the day after uses sch.SlotOn(date.AddDate(0, 0, 1))
// and spec.DateOf(slot).AddDate(0, 0, -1), as the sample service's Plan does.
//
// # Cron syntax
//
// Specs use robfig/cron/v3's standard parser: five fields (minute, hour,
// day of month, month, day of week) or a descriptor (@yearly, @annually,
// @monthly, @weekly, @daily, @midnight, @hourly). Day of month and day of week
// combine as in Vixie cron: if either field is '*' a day must match both,
// otherwise either. A "CRON_TZ=Asia/Tokyo " or "TZ=Asia/Tokyo " prefix
// overrides the zone passed to ParseSpec.
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
package schedule
