package settlement

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/workflow"
)

// ScheduleName is the name of the daily settlement schedule; it starts every run key.
const ScheduleName = "settle"

// SettleQueue is the River queue settle runs are worked in, apart from Stepwise's maintenance
// and schedule ticks (default queue) and the outbox's queues, so a day's settlement cannot
// starve them.
const SettleQueue = "settle"

// InsertOpts puts settle runs in SettleQueue.
func (SettleArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: SettleQueue} }

// Plan fixes how a business date becomes runs: the daily schedule's slot on the day after
// the date, fanned out to Shards runs with keys "settle/<slot>/<shard>". The schedule (serve)
// and a settlement started by hand (settle --date, demo) both go through Plan, so they use
// the same run keys and the same input: whichever starts a date first, the other finds the
// runs there (a key is one run, forever) and no date is ever settled by two
// sets of runs.
type Plan struct {
	// Spec is the schedule's cron spec: one fixed local time per day, at which the previous
	// day is settled. Defaults to "0 1 * * *" (01:00).
	Spec string
	// Zone is the IANA zone business dates and Spec are read in. Defaults to "UTC".
	Zone string
	// Shards is how many runs settle a date. Changing it changes the runs' input, so a date
	// already started with another count is refused (workflow.ErrRunConflict), never settled
	// twice. Defaults to 4.
	Shards int

	spec *schedule.Spec
}

// WithDefaults returns a copy of p with zero fields set to their defaults.
func (p Plan) WithDefaults() Plan {
	if p.Spec == "" {
		p.Spec = "0 1 * * *"
	}
	if p.Zone == "" {
		p.Zone = "UTC"
	}
	if p.Shards == 0 {
		p.Shards = 4
	}
	return p
}

// Compile validates p (with defaults) and prepares it for use.
func (p Plan) Compile() (Plan, error) {
	p = p.WithDefaults()
	if p.Shards < 1 || p.Shards > 1024 {
		return p, fmt.Errorf("shards %d: want 1 to 1024", p.Shards)
	}
	loc, err := schedule.LoadZone(p.Zone)
	if err != nil {
		return p, fmt.Errorf("zone: %w", err)
	}
	spec, err := schedule.ParseSpec(p.Spec, loc, schedule.GapRunAfter)
	if err != nil {
		return p, fmt.Errorf("schedule: %w", err)
	}
	// A settlement date needs exactly one slot per local day: two would start a second set
	// of runs for the date (harmless, thanks to the business key, but wasteful and
	// confusing), none would leave a date unsettled.
	first := spec.Next(time.Date(2026, 1, 1, 0, 0, 0, 0, loc))
	second := spec.Next(first)
	if !spec.FixedTime() || spec.DateOf(second) != spec.DateOf(first).AddDate(0, 0, 1) {
		return p, fmt.Errorf("schedule %q: want one fixed time every day, such as \"0 1 * * *\"", p.Spec)
	}
	p.spec = spec
	return p, nil
}

func (p Plan) compiled() (Plan, error) {
	if p.spec != nil {
		return p, nil
	}
	return p.Compile()
}

// Slot returns the schedule slot that settles date: the schedule's time on the next local
// day, in UTC.
func (p Plan) Slot(date time.Time) (time.Time, error) {
	p, err := p.compiled()
	if err != nil {
		return time.Time{}, err
	}
	slot, err := p.spec.SlotOn(date.AddDate(0, 0, 1))
	if err != nil {
		return time.Time{}, fmt.Errorf("date %s is settled on the next day: %w", date.Format(time.DateOnly), err)
	}
	return slot, nil
}

// DateOf returns the business date a slot settles: the local day before the slot.
func (p Plan) DateOf(slot time.Time) time.Time {
	p, err := p.compiled()
	if err != nil {
		return time.Time{}
	}
	return p.spec.DateOf(slot).AddDate(0, 0, -1)
}

// Args returns the input of the run of (slot, shard). It is the schedule's Args function.
func (p Plan) Args(slot time.Time, shard int) SettleArgs {
	p = p.WithDefaults()
	return SettleArgs{Date: p.DateOf(slot).Format(time.DateOnly), Shard: shard, Shards: p.Shards}
}

// RunKeys returns the keys of the runs that settle date, shard 0 first.
func (p Plan) RunKeys(date time.Time) ([]string, error) {
	p, err := p.compiled()
	if err != nil {
		return nil, err
	}
	slot, err := p.Slot(date)
	if err != nil {
		return nil, err
	}
	return schedule.RunKeys(ScheduleName, slot, p.Shards), nil
}

// Schedule returns the daily schedule, for stepwise.Config.Schedules. A date's slots are caught up
// after an outage (CatchUpAll): each date is its own batch of money, and skipping one would
// leave merchants unpaid. Dates are independent, so slots may overlap (OverlapAllowAll).
func (p Plan) Schedule() (schedule.Schedule[SettleArgs], error) {
	p, err := p.compiled()
	if err != nil {
		return schedule.Schedule[SettleArgs]{}, err
	}
	return schedule.Schedule[SettleArgs]{
		Name:    ScheduleName,
		Spec:    p.Spec,
		Zone:    p.Zone,
		Misfire: schedule.CatchUpAll{Max: 31, PerTick: 2},
		Overlap: schedule.OverlapAllowAll,
		Shards:  p.Shards,
		Args:    p.Args,
	}, nil
}

// Start starts the runs that settle date, all in one transaction, or finds them started
// (by the schedule or an earlier call): it is idempotent. created reports whether this call
// started them. actor names who starts the date; it is recorded as the slot's decider.
func (p Plan) Start(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, date time.Time, actor string) (runs []*workflow.Run, created bool, err error) {
	p, err = p.compiled()
	if err != nil {
		return nil, false, err
	}
	slot, err := p.Slot(date)
	if err != nil {
		return nil, false, err
	}
	sch, err := p.Schedule()
	if err != nil {
		return nil, false, err
	}
	runs, err = schedule.StartSlot(ctx, client, tx, sch, slot, actor)
	if errors.Is(err, workflow.ErrRunConflict) {
		return nil, false, fmt.Errorf("date %s was started with another shard count than %d; settle it with the count it was started with: %w",
			date.Format(time.DateOnly), p.Shards, err)
	}
	if err != nil {
		return nil, false, err
	}
	for _, run := range runs {
		created = created || run.Created
	}
	return runs, created, nil
}
