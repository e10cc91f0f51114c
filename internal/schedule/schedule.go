package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"regexp"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise/internal/runstart"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// OverlapPolicy decides what happens to a slot that falls due while runs of an earlier slot
// of the same schedule are still pending or running. There is no default: a settlement that
// silently overlapped itself, or silently did not run, would both be wrong somewhere, so the
// schedule must say which it wants.
type OverlapPolicy int

const (
	// OverlapAllowAll starts every slot when it is due, whatever is still running.
	OverlapAllowAll OverlapPolicy = iota + 1

	// OverlapSkip records a slot as skipped (reason overlap_skip) when an earlier slot's
	// runs are unfinished.
	OverlapSkip

	// OverlapBufferOne keeps one slot waiting (buffered) while an earlier slot's runs are
	// unfinished and starts it when they end; further slots due meanwhile are recorded as
	// skipped (reason overlap_buffer_full). The oldest waiting slot is kept, as in
	// Temporal's BUFFER_ONE.
	OverlapBufferOne

	// OverlapBufferAll keeps every slot that falls due while an earlier one is unfinished
	// and starts them one at a time in slot order: runs of the schedule are strictly
	// serial. Nothing is skipped; a run that never ends holds back every later slot
	// (visible as buffered slots in stepwise.Client.SlotList).
	OverlapBufferAll

	// OverlapCancelOther asks the unfinished runs of earlier slots to stop (CancelRun: their
	// step's context is cancelled, they end 'cancelled' and record why) and starts the new
	// slot once they have ended, so two slots' runs never work at once. A slot still
	// waiting when a newer one arrives is itself superseded (skipped, reason
	// overlap_superseded).
	OverlapCancelOther
)

// String returns the policy's stored name: allow_all, skip, buffer_one, buffer_all or
// cancel_other.
func (o OverlapPolicy) String() string {
	switch o {
	case OverlapAllowAll:
		return "allow_all"
	case OverlapSkip:
		return "skip"
	case OverlapBufferOne:
		return "buffer_one"
	case OverlapBufferAll:
		return "buffer_all"
	case OverlapCancelOther:
		return "cancel_other"
	}
	return fmt.Sprintf("OverlapPolicy(%d)", int(o))
}

// MisfirePolicy decides what happens to slots that fell due while no tick ran: an outage,
// a deploy, a leader change, a paused schedule. Use CatchUpAll, RunLatest or SkipMissed.
type MisfirePolicy interface {
	// describe returns the policy as stored in stepwise_schedule.misfire.
	describe() map[string]any
	// withDefaults returns the policy with zero fields set to their defaults.
	withDefaults() MisfirePolicy
	// validate checks the policy for a schedule ticked every tickInterval.
	validate(tickInterval time.Duration) error
}

// Defaults of CatchUpAll's fields, applied to zero fields.
const (
	CatchUpMaxDefault     = 1000
	CatchUpPerTickDefault = 100
)

// CatchUpAll runs every missed slot, oldest first, but bounded so that a long outage does
// not flood the database and the workers: at most PerTick slots are materialized per tick
// (a rate of PerTick per Config.TickInterval), and when more than Max slots are
// waiting, the oldest beyond Max are recorded as skipped (reason catch_up_limit).
type CatchUpAll struct {
	// Max is the most slots a tick keeps waiting to be caught up; older ones are skipped.
	// Defaults to 1,000.
	Max int

	// PerTick is the most slots one tick materializes (each with Shards runs).
	// Defaults to 100.
	PerTick int
}

func (p CatchUpAll) describe() map[string]any {
	return map[string]any{"policy": "catch_up_all", "max": p.Max, "per_tick": p.PerTick}
}

func (p CatchUpAll) withDefaults() MisfirePolicy {
	if p.Max == 0 {
		p.Max = CatchUpMaxDefault
	}
	if p.PerTick == 0 {
		p.PerTick = CatchUpPerTickDefault
	}
	return p
}

func (p CatchUpAll) validate(time.Duration) error {
	switch {
	case p.Max < 0:
		return fmt.Errorf("misfire policy CatchUpAll.Max is %d; it must be positive (0 means the default, %d)", p.Max, CatchUpMaxDefault)
	case p.PerTick < 0:
		return fmt.Errorf("misfire policy CatchUpAll.PerTick is %d; it must be positive (0 means the default, %d)", p.PerTick, CatchUpPerTickDefault)
	}
	return nil
}

// RunLatest runs only the newest missed slot and records the older ones as skipped (reason
// misfire_run_latest). Right for a job whose newest run supersedes older ones (a refresh),
// wrong for one where each slot is its own batch (a daily settlement).
type RunLatest struct{}

func (RunLatest) describe() map[string]any      { return map[string]any{"policy": "run_latest"} }
func (p RunLatest) withDefaults() MisfirePolicy { return p }
func (RunLatest) validate(time.Duration) error  { return nil }

// SkipMissed runs a slot only if a tick decides it within StartingDeadline of its time, like
// a Kubernetes CronJob's startingDeadlineSeconds; slots later than that are recorded as
// skipped (reason misfire_deadline). It is named SkipMissed rather than Skip so it cannot be
// read as a step outcome beside Continue and Done.
type SkipMissed struct {
	// StartingDeadline is how late a slot may still start. It must be longer than the
	// scheduler's TickInterval, or slots would be skipped in normal operation merely for
	// waiting for the next tick. Required.
	StartingDeadline time.Duration
}

func (p SkipMissed) withDefaults() MisfirePolicy { return p }
func (p SkipMissed) describe() map[string]any {
	return map[string]any{"policy": "skip_missed", "starting_deadline": p.StartingDeadline.String()}
}

func (p SkipMissed) validate(tickInterval time.Duration) error {
	if p.StartingDeadline <= tickInterval {
		return fmt.Errorf("misfire policy SkipMissed.StartingDeadline is %s; it must be longer than the scheduler's TickInterval (%s), or on-time slots would be skipped while waiting for a tick; e.g. %s",
			p.StartingDeadline, tickInterval, 3*tickInterval)
	}
	return nil
}

// Schedule defines a durable cron schedule whose slots start runs of A's workflow. Register
// it with Add.
type Schedule[A river.JobArgs] struct {
	// Name identifies the schedule forever: its row, its slots and its run keys
	// ("<Name>/<slot>/<shard>"). 1 to 128 characters of letters, digits, '_', '.', ':' and
	// '-', starting with a letter or digit. Required.
	Name string

	// Spec is a cron spec in robfig/cron/v3's standard syntax: five fields "minute hour
	// day-of-month month day-of-week", or a descriptor (@daily, @hourly, @weekly, @monthly,
	// @yearly). A "CRON_TZ=Zone " prefix overrides Zone. @every is refused: its slots would
	// depend on when a process started. Required.
	Spec string

	// Zone is the IANA time zone the spec is read in, e.g. "America/New_York" or "UTC".
	// Required unless Spec starts with CRON_TZ=; "Local" is refused, because it differs
	// between hosts and every node must compute the same slots.
	Zone string

	// Gap says what happens to a fixed local time that falls in a spring-forward gap.
	// Defaults to GapRunAfter.
	Gap GapPolicy

	// Misfire decides slots missed while no tick ran. Required: CatchUpAll, RunLatest or
	// SkipMissed.
	Misfire MisfirePolicy

	// Overlap decides a slot that falls due while an earlier slot's runs are unfinished.
	// Required.
	Overlap OverlapPolicy

	// Shards is how many runs each slot fans out to, shard 0 to Shards-1; use ShardOf to
	// assign business keys to shards. Required, at least 1.
	Shards int

	// Args builds the input of the run for (slot, shard). slot is in UTC: a business date
	// is its day in the schedule's zone, slot.In(zone).Format(time.DateOnly) (Spec.DateOf),
	// not slot.Format, which gives the UTC day; Schedule.SlotOn goes back from a date to its
	// slot. It must be deterministic: the run's key is fixed by (slot, shard), and a second
	// start with different input is ErrRunConflict. Required.
	Args func(slot time.Time, shard int) A

	// InsertOpts are passed to River for each run's job (queue, priority, max attempts).
	// Defaults to nil: River's defaults.
	InsertOpts *river.InsertOpts

	// StartAt, for a schedule that has no row yet, makes the first slot considered the
	// first one at or after StartAt, so history since StartAt is back-filled through the
	// misfire policy. Defaults to the zero time: the schedule starts at its first tick, with
	// no back-fill. Ignored once the schedule's row exists (its watermark rules).
	StartAt time.Time
}

// scheduleNameRE matches names valid in stepwise_schedule.name; keep the two in step.
var scheduleNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)

// schedule is a registered Schedule with its type parameter erased.
type schedule struct {
	name       string
	spec       *Spec
	specText   string
	zone       string
	gap        GapPolicy
	misfire    MisfirePolicy
	overlap    OverlapPolicy
	shards     int
	startAt    time.Time
	workflow   string
	start      func(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, slot time.Time, shard int) (created bool, err error)
	misfireDoc []byte // misfire.describe() as JSON
}

func gapName(g GapPolicy) string {
	if g == GapSkip {
		return "skip"
	}
	return "run_after"
}

// Defaults of Config's fields, which ConfigWithDefaults applies to zero fields.
const (
	TickIntervalDefault    = 5 * time.Second
	MaxSlotsPerTickDefault = 10_000
)

// Config configures a Scheduler.
type Config struct {
	// TickInterval is how often River's leader inserts the tick job that materializes due
	// slots. A slot starts at most about TickInterval after its time. Defaults to 5s.
	TickInterval time.Duration

	// Now is the clock ticks compare slots with. Defaults to nil: the database's clock
	// (now() of the tick's transaction). The database clock is the one every node shares:
	// a node whose own clock ran ahead would otherwise materialize slots before they are
	// due, one running behind would start them late, and two nodes would disagree about
	// which slots are due; leases are timed by the same clock. Tests set it to control time.
	Now func() time.Time

	// MaxSlotsPerTick bounds how many slots one tick decides per schedule (skipped ones
	// included), which bounds the tick's transaction. A longer backlog is worked off over
	// the following ticks. Defaults to 10,000.
	MaxSlotsPerTick int

	// Logger receives schedule changes and tick failures. Defaults to the Engine's logger.
	Logger *slog.Logger
}

// ConfigWithDefaults returns a copy of c with zero fields set to their defaults; users see
// them through stepwise.Config.WithDefaults.
func ConfigWithDefaults(c *Config) *Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.TickInterval == 0 {
		out.TickInterval = TickIntervalDefault
	}
	if out.MaxSlotsPerTick == 0 {
		out.MaxSlotsPerTick = MaxSlotsPerTickDefault
	}
	return &out
}

// CheckConfig refuses a Config that New would refuse (zero fields take their defaults): for
// a client with no schedules yet, whose scheduler is not built.
func CheckConfig(c *Config) error { return ConfigWithDefaults(c).validate() }

func (c *Config) validate() error {
	switch {
	case c.TickInterval <= 0:
		return fmt.Errorf("schedule.Config.TickInterval is %s; it must be positive (0 means the default, %s)", c.TickInterval, TickIntervalDefault)
	case c.MaxSlotsPerTick < 1:
		return fmt.Errorf("schedule.Config.MaxSlotsPerTick is %d; it must be positive (0 means the default, %d)", c.MaxSlotsPerTick, MaxSlotsPerTickDefault)
	}
	return nil
}

// Scheduler ticks the registered schedules: it decides their due slots and starts the slots'
// runs (see the package doc). Create one per Engine with New and register schedules with Add.
// Every node should register the same schedules: the tick job runs on whichever node fetches
// it, and ticks only the schedules that node knows. Tick can also be called by hand.
type Scheduler struct {
	pool    *pgxpool.Pool
	cfg     *Config
	logger  *slog.Logger
	metrics *metrics

	mu        sync.Mutex
	schedules []*schedule
	byName    map[string]*schedule
}

// New returns a Scheduler whose runs are started through engine's tables.
func New(engine *workflow.Engine, cfg *Config) (*Scheduler, error) {
	if engine == nil {
		return nil, errors.New("schedule.New: engine is nil; create one with workflow.New")
	}
	cfg = ConfigWithDefaults(cfg)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = engine.Config().Logger
	}
	return &Scheduler{
		pool:    engine.Checkpoints().Pool(),
		cfg:     cfg,
		logger:  logger,
		metrics: newMetrics(),
		byName:  map[string]*schedule{},
	}, nil
}

// Add registers a schedule. Every mistake a schedule can hold is reported here, at
// registration, naming the schedule and the fix, never at fire time: an invalid spec, an
// unknown zone, a missing policy, fewer than one shard, a name already registered.
//
// Registration is in memory; the schedule's row is created or updated by the next tick
// (under the row's lock, so concurrent nodes do not race). A changed definition keeps the
// watermark, so it takes effect from the next slot, and is audited as a 'schedule.changed'
// event with the old and new definition. The code's definition is the source of truth; the
// row mirrors it for operators and audit. During a rolling deploy that changes a definition,
// old and new nodes may both work tick jobs and the row follows whichever ticked last (each
// switch audited); pause the schedule for the deploy (Pause) if a slot decided under
// the old definition in that window would matter.
func Add[A river.JobArgs](s *Scheduler, sch Schedule[A]) error {
	if s == nil {
		return errors.New("schedule.Add: scheduler is nil; create one with schedule.New")
	}
	def, err := compileSchedule(sch, s.cfg.TickInterval)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.byName[sch.Name]; dup {
		return fmt.Errorf("%w: schedule %q is registered twice: give each schedule its own Name", ErrInvalid, sch.Name)
	}
	s.byName[sch.Name] = def
	s.schedules = append(s.schedules, def)
	return nil
}

// compileSchedule validates sch and erases its type parameter. tickInterval is the
// scheduler's, which some policies are checked against.
func compileSchedule[A river.JobArgs](sch Schedule[A], tickInterval time.Duration) (*schedule, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: schedule %q: %s", ErrInvalid, sch.Name, fmt.Sprintf(format, args...))
	}
	if !scheduleNameRE.MatchString(sch.Name) {
		return nil, fmt.Errorf("%w: schedule name %q: use 1 to 128 letters, digits, '_', '.', ':' or '-', starting with a letter or digit (it goes into run keys \"<name>/<slot>/<shard>\")",
			ErrInvalid, sch.Name)
	}
	spec, err := parseScheduleSpec(sch.Name, sch.Spec, sch.Zone, sch.Gap)
	if err != nil {
		return nil, err
	}
	if sch.Misfire == nil {
		return nil, fail("Misfire is nil: choose schedule.CatchUpAll{Max: ..., PerTick: ...}, schedule.RunLatest{} or schedule.SkipMissed{StartingDeadline: ...}")
	}
	misfire := sch.Misfire.withDefaults()
	if err := misfire.validate(tickInterval); err != nil {
		return nil, fail("%v", err)
	}
	if sch.Overlap < OverlapAllowAll || sch.Overlap > OverlapCancelOther {
		return nil, fail("Overlap is %s: choose schedule.OverlapAllowAll, OverlapSkip, OverlapBufferOne, OverlapBufferAll or OverlapCancelOther", sch.Overlap)
	}
	if sch.Shards < 1 {
		return nil, fail("Shards is %d: a slot needs at least one run; set Shards to 1 for an unsharded schedule", sch.Shards)
	}
	if sch.Args == nil {
		return nil, fail("Args is nil: give a func(slot time.Time, shard int) %T that builds each run's input", *new(A))
	}
	misfireDoc, err := json.Marshal(misfire.describe())
	if err != nil {
		return nil, fail("encoding misfire policy: %v", err)
	}
	var a A
	def := &schedule{
		name:       sch.Name,
		spec:       spec,
		specText:   spec.String(),
		zone:       spec.Location().String(),
		gap:        sch.Gap,
		misfire:    misfire,
		overlap:    sch.Overlap,
		shards:     sch.Shards,
		startAt:    sch.StartAt,
		workflow:   a.Kind(),
		misfireDoc: misfireDoc,
	}
	args, insertOpts, name := sch.Args, sch.InsertOpts, sch.Name
	def.start = func(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, slot time.Time, shard int) (bool, error) {
		var opts *river.InsertOpts
		if insertOpts != nil {
			cp := *insertOpts
			opts = &cp
		}
		return runstart.Tx(ctx, client, tx, RunKey(name, slot, shard), args(slot, shard),
			runstart.Params{Opts: opts, Slot: &runstart.Slot{Schedule: name, Time: slot, Shard: shard}})
	}
	return def, nil
}

// parseScheduleSpec parses the Spec of the schedule name in its Zone (empty when the spec
// starts with CRON_TZ=), as Add does. Errors match ErrInvalid and name the schedule and the
// field at fault.
func parseScheduleSpec(name, specText, zoneName string, gap GapPolicy) (*Spec, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: schedule %q: %s", ErrInvalid, name, fmt.Sprintf(format, args...))
	}
	var zone *time.Location
	if zoneName != "" {
		var err error
		if zone, err = LoadZone(zoneName); err != nil {
			return nil, fail("Zone: %v", err)
		}
	}
	spec, err := ParseSpec(specText, zone, gap)
	if err != nil {
		if zone == nil && !errors.Is(err, ErrUnknownZone) {
			return nil, fail("%v (Zone is empty: set Zone to an IANA name such as \"America/New_York\" or \"UTC\", or prefix the spec with CRON_TZ=)", err)
		}
		return nil, fail("Spec: %v", err)
	}
	return spec, nil
}

// RunKey returns the run key of a schedule's slot and shard:
// "<schedule>/<slot in RFC 3339, UTC>/<shard>", e.g. "settle/2026-03-08T07:00:00Z/3".
func RunKey(schedule string, slot time.Time, shard int) string {
	return fmt.Sprintf("%s/%s/%d", schedule, slot.UTC().Format(time.RFC3339), shard)
}

// ShardOf returns the shard, in [0, n), of a business key: the 64-bit FNV-1a hash of the
// key's bytes modulo n. The hash is fixed forever (tests pin its values): changing it would
// move items between shards of runs already started, so an item could be processed by two
// shards or by none. ShardOf panics if n < 1, like a division by zero.
func ShardOf(key string, n int) int {
	if n < 1 {
		panic(fmt.Sprintf("schedule.ShardOf: n is %d; a schedule has at least one shard", n))
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(key)) // hash.Hash.Write never fails
	return int(h.Sum64() % uint64(n))
}

// StartSlot starts the runs of one slot of sch in tx, as the tick that materializes the slot
// does: one run per shard, keyed RunKey(sch.Name, slot, shard), with input
// sch.Args(slot, shard) and the schedule, slot and shard recorded on the run. A run that
// exists already is returned as it is (Created false), so StartSlot may be called for a slot
// a tick has started, or again. Use it to run a slot by hand, ahead of its tick, long after
// it (a date to re-run), or in a process without a Scheduler.
//
// slot must be one of the spec's slots; sch is checked as Add checks it. actor names who
// starts the slot (a person, a tool); it is required.
//
// The slot's decision is recorded in tx with its runs: materialized, decided by actor (the
// slot report's DecidedBy), audited as 'schedule.slot_started'. So stepwise.Client.SlotGet reports the slot
// at once, a past slot no tick will reach included; the tick that reaches a slot started
// ahead of it passes over it instead of deciding it again; and while its runs are unfinished
// the slot counts as in flight for the schedule's overlap policy. A slot the tick recorded
// skipped or buffered becomes materialized, its detail saying what it was. A slot already
// materialized is left as it is. StartSlot holds a share lock on the schedule's row (when it
// has one) until tx ends: a tick meanwhile passes over the schedule.
//
// A slot that was materialized and whose runs are gone (pruned by a release before retention
// kept them) is refused with ErrSlotRunsMissing: starting them again would redo the slot from
// the start.
//
// This is the only way, besides a Scheduler, to start a run that belongs to a slot:
// workflow.StartOpts cannot set one.
func StartSlot[A river.JobArgs](ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, sch Schedule[A], slot time.Time, actor string) ([]*workflow.Run, error) {
	switch {
	case client == nil:
		return nil, errors.New("schedule.StartSlot: client is nil; pass the River client the runs should be inserted with")
	case tx == nil:
		return nil, errors.New("schedule.StartSlot: tx is nil; pass the transaction the runs should be started in")
	case actor == "":
		return nil, fmt.Errorf("%w: schedule.StartSlot of schedule %q: actor is empty; name who starts the slot (it is recorded as the slot's decider)", ErrInvalid, sch.Name)
	}
	def, err := compileSchedule(sch, 0)
	if err != nil {
		return nil, err
	}
	slot = slot.UTC()
	if next := def.spec.Next(slot.Add(-time.Nanosecond)); !next.Equal(slot) {
		return nil, fmt.Errorf("%w: schedule %q: %s is not a slot of %q in %s; pass one of its slots, e.g. %s",
			ErrInvalid, sch.Name, fmtSlot(slot), def.specText, def.zone, fmtSlot(next))
	}
	if err := refuseSlotWithoutRuns(ctx, tx, sch.Name, slot); err != nil {
		return nil, err
	}
	if err := recordStartedByHand(ctx, tx, def, slot, actor); err != nil {
		return nil, err
	}
	runs := make([]*workflow.Run, 0, def.shards)
	for shard := range def.shards {
		created, err := def.start(ctx, client, tx, slot, shard)
		if err != nil {
			return nil, fmt.Errorf("starting run of schedule %q slot %s shard %d: %w", sch.Name, fmtSlot(slot), shard, err)
		}
		run, err := workflow.GetRun(ctx, tx, RunKey(sch.Name, slot, shard))
		if err != nil {
			return nil, err
		}
		run.Created = created
		runs = append(runs, run)
	}
	return runs, nil
}

// recordStartedByHand records, in tx, that actor started slot of def by hand: the slot's
// decision (materialized, decided_by actor) and a 'schedule.slot_started' event. Guards
// against: the tick later deciding the slot by its policies (SKIPPED while its runs run),
// the overlap policy not counting the slot's runs (two slots in flight under OverlapSkip),
// and a past slot, which no tick reaches, never having a status.
//
// It first takes a key-share lock on the schedule's row, if there is one, so that a tick
// deciding the schedule's slots right now finishes first (and this slot's row then meets
// the tick's decision below), and a tick starting meanwhile passes over the schedule (its
// FOR UPDATE SKIP LOCKED) instead of planning without this slot. Without a row (no tick yet)
// the version recorded is 0.
func recordStartedByHand(ctx context.Context, tx pgx.Tx, def *schedule, slot time.Time, actor string) error {
	version := 0
	err := tx.QueryRow(ctx, `SELECT version FROM stepwise_schedule WHERE name = $1 FOR KEY SHARE`, def.name).Scan(&version)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("locking schedule %q to record slot %s: %w", def.name, fmtSlot(slot), err)
	}
	// One statement: a slot no one decided is inserted; one a tick skipped or buffered becomes
	// materialized, saying what it was; one already materialized is left alone (and no event
	// is written: calling StartSlot again changes nothing).
	_, err = tx.Exec(ctx, `
		WITH prev AS (
			SELECT status FROM stepwise_schedule_slot WHERE schedule = $1 AND slot = $2
		), up AS (
			INSERT INTO stepwise_schedule_slot AS sl
			       (schedule, slot, status, detail, shards, version, created_at, materialized_at, decided_by)
			VALUES ($1, $2, 'materialized', 'started by hand by ' || $5, $3, $4, now(), now(), $5)
			ON CONFLICT (schedule, slot) DO UPDATE
			   SET status = 'materialized', reason = NULL, shards = EXCLUDED.shards, version = EXCLUDED.version,
			       materialized_at = now(), decided_by = EXCLUDED.decided_by,
			       detail = 'was ' || sl.status || coalesce(' (' || coalesce(sl.reason || ': ', '') || sl.detail || ')', '')
			                || '; started by hand by ' || EXCLUDED.decided_by
			 WHERE sl.status IN ('skipped', 'buffered')
			RETURNING sl.slot
		)
		INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, detail)
		SELECT 'schedule:' || $1, 'schedule.slot_started', (SELECT status FROM prev), 'materialized', $5,
		       jsonb_build_object('slot', $2::timestamptz, 'shards', $3::int, 'version', $4::int)
		  FROM up`,
		def.name, slot, def.shards, version, actor)
	if err != nil {
		return fmt.Errorf("recording slot %s of schedule %q as started by hand: %w", fmtSlot(slot), def.name, err)
	}
	return nil
}

// AddTo registers the schedule with s: Add(s, sch). It lets a list hold schedules of
// different argument types (stepwise.Config.Schedules).
func (sch Schedule[A]) AddTo(s *Scheduler) error { return Add(s, sch) }
