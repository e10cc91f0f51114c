package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/stepwise-go/stepwise/internal/faultpoint"
	"github.com/stepwise-go/stepwise/internal/pgtx"
	"github.com/stepwise-go/stepwise/internal/workflow"
)

// tickArgs are the args of the Scheduler's tick job.
type tickArgs struct{}

// Kind is the River job kind of the tick job.
func (tickArgs) Kind() string { return "stepwise_schedule_tick" }

type tickWorker struct {
	river.WorkerDefaults[tickArgs]
	s *Scheduler
}

func (w *tickWorker) Work(ctx context.Context, _ *river.Job[tickArgs]) error {
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return err
	}
	_, err = w.s.Tick(ctx, client)
	return err
}

// Install wires the Scheduler into a River client config, before river.NewClient: it adds
// the tick worker, the tick periodic job (every Config.TickInterval) and River's default
// queue, which the tick job is inserted in, if the config has no queue of that name. It
// returns an error if the tick worker is already registered in rc.Workers (one Scheduler per
// client). Run RunMaintenance beside it in every process.
func (s *Scheduler) Install(rc *river.Config) error {
	if rc == nil {
		return errors.New("schedule.Scheduler.Install: river config is nil; pass the *river.Config you give river.NewClient")
	}
	if rc.Workers == nil {
		rc.Workers = river.NewWorkers()
	}
	if err := river.AddWorkerSafely[tickArgs](rc.Workers, &tickWorker{s: s}); err != nil {
		return fmt.Errorf("schedule.Scheduler.Install: %w (install one Scheduler per river.Config)", err)
	}
	rc.PeriodicJobs = append(rc.PeriodicJobs, s.periodicJobs()...)
	if rc.Queues == nil {
		rc.Queues = map[string]river.QueueConfig{}
	}
	if _, ok := rc.Queues[river.QueueDefault]; !ok {
		rc.Queues[river.QueueDefault] = river.QueueConfig{MaxWorkers: 1}
	}
	return nil
}

// RunMaintenance ticks every TickInterval (with jitter) until ctx ends, and returns nil then.
// Call it in a goroutine of every process, as workflow.Engine.RunMaintenance: the tick job is
// a periodic job, which River's elected leader alone inserts, so when the leader dies no slot
// is decided until a new leader is elected. Ticks in several processes at once are safe: each
// schedule's tick holds its row's lock and skips a schedule another tick holds. Failed ticks
// are logged and counted (stepwise_schedule_ticks_total{result="error"}).
func (s *Scheduler) RunMaintenance(ctx context.Context, client *river.Client[pgx.Tx]) error {
	if client == nil {
		return errors.New("schedule.Scheduler.RunMaintenance: client is nil; pass the River client the runs should be inserted with")
	}
	for {
		wait := s.cfg.TickInterval + rand.N(s.cfg.TickInterval/5+time.Millisecond)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		_, _ = s.Tick(ctx, client) // Tick logs and counts its failures
	}
}

// periodicJobs returns the tick job, which Install adds to river.Config.PeriodicJobs. River inserts
// periodic jobs from its elected leader only; the tick is safe even when two run at once
// (a row lock per schedule), so a leader change or a manual Tick never double-starts a slot.
func (s *Scheduler) periodicJobs() []*river.PeriodicJob {
	return []*river.PeriodicJob{
		river.NewPeriodicJob(
			river.PeriodicInterval(s.cfg.TickInterval),
			func() (river.JobArgs, *river.InsertOpts) {
				// Unique while one is waiting or running in a period, so slow ticks do not
				// pile up; completed ticks are left out of ByState, unlike River's default,
				// or the first completed tick would block every later one until River's job
				// cleaner removed it (a day by default). ByPeriod, so that a tick left
				// 'running' by a killed process blocks its own period only, not every tick
				// until River rescues it an hour later.
				return tickArgs{}, &river.InsertOpts{UniqueOpts: river.UniqueOpts{
					ByArgs:   true,
					ByPeriod: max(s.cfg.TickInterval, time.Second), // River's minimum period

					ByState: []rivertype.JobState{
						rivertype.JobStateAvailable, rivertype.JobStatePending,
						rivertype.JobStateRunning, rivertype.JobStateScheduled,
					},
				}}
			},
			&river.PeriodicJobOpts{ID: "stepwise_schedule_tick", RunOnStart: true},
		),
	}
}

// Metrics returns the Scheduler's Prometheus collector; register it with your registry:
//
//	prometheus.MustRegister(sched.Metrics())
//
// It counts what this process's ticks committed (sum across processes): start and
// materialize lag, misfires, skipped slots by reason, slots by decision and ticks by result,
// all labelled by schedule (stepwise_schedule_*).
func (s *Scheduler) Metrics() prometheus.Collector { return s.metrics }

// TickResult says what one Tick did, per registered schedule, in registration order.
type TickResult struct {
	Schedules []*TickOutcome
}

// Schedule returns the result for the named schedule, or nil.
func (r *TickResult) Schedule(name string) *TickOutcome {
	if r == nil {
		return nil
	}
	for _, s := range r.Schedules {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// TickOutcome is what one tick did to one schedule.
type TickOutcome struct {
	Name string

	// Locked is true when another tick held the schedule's row; this one did nothing.
	Locked bool

	// Paused is true when the schedule is paused; nothing was decided.
	Paused bool

	// Created and Changed report that this tick created the schedule's row, or updated it
	// to the definition registered in code (audited as 'schedule.changed').
	Created, Changed bool

	// Materialized are the slots whose runs this tick started, oldest first (new slots and
	// buffered slots whose turn came).
	Materialized []time.Time

	// Buffered are new slots recorded as waiting for earlier runs.
	Buffered []time.Time

	// Skipped are slots recorded as skipped, with their reason codes.
	Skipped []SkippedSlot

	// CancelRequested are the keys of runs this tick asked to stop (OverlapCancelOther).
	CancelRequested []string

	// RunsStarted counts runs created (Materialized times shards, less any run that
	// already existed under its key).
	RunsStarted int

	// Watermark is the schedule's watermark after the tick.
	Watermark time.Time
}

// SkippedSlot is a slot recorded as skipped, and why (one of the Reason… codes).
type SkippedSlot struct {
	Slot   time.Time
	Reason string
}

// Tick decides every due slot of every registered schedule now: the tick job calls it every
// TickInterval, and it may be called by hand. Each schedule is ticked in its own
// transaction; an error in one does not stop the others (the errors are joined).
//
// A schedule's tick locks its row with FOR UPDATE SKIP LOCKED, so a second tick running at
// the same time skips it (Locked) instead of waiting and then deciding the same slots again;
// run keys are unique besides, so even a duplicate decision could not start a second run.
// The tick then updates the row's definition if the code's differs, marks which in-flight
// slots' runs have finished, plans (planTick; passing over slots StartSlot decided ahead of
// the watermark), records each decided slot, starts the runs
// and their River jobs with StartTx, advances the watermark, and commits all of it at once.
// A crash before the commit leaves nothing done; a crash after it (fault point
// tick-after-commit) leaves everything done, and the next tick finds nothing new to do.
func (s *Scheduler) Tick(ctx context.Context, client *river.Client[pgx.Tx]) (*TickResult, error) {
	if client == nil {
		return nil, errors.New("schedule.Scheduler.Tick: client is nil; pass the River client the runs should be inserted with")
	}
	s.mu.Lock()
	list := slices.Clone(s.schedules)
	s.mu.Unlock()

	res := &TickResult{}
	var errs []error
	for _, def := range list {
		st, err := s.tickSchedule(ctx, client, def)
		if st != nil {
			res.Schedules = append(res.Schedules, st)
		}
		if err != nil {
			s.metrics.Ticks.WithLabelValues(def.name, "error").Inc()
			s.logger.ErrorContext(ctx, "stepwise: schedule tick failed", "schedule", def.name, "error", err)
			errs = append(errs, fmt.Errorf("ticking schedule %q: %w", def.name, err))
		}
	}
	return res, errors.Join(errs...)
}

// storedSchedule is a stepwise_schedule row as the tick reads it.
type storedSchedule struct {
	spec, zone, gap, overlap string
	misfire                  json.RawMessage
	shards                   int
	watermark                time.Time
	paused                   bool
	version                  int
	dbNow                    time.Time
}

func (s *Scheduler) tickSchedule(ctx context.Context, client *river.Client[pgx.Tx], def *schedule) (*TickOutcome, error) {
	st := &TickOutcome{Name: def.name}
	var clock *time.Time
	if s.cfg.Now != nil {
		t := s.cfg.Now().UTC()
		clock = &t
	}

	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("beginning tick: %w", err)
	}
	defer pgtx.Rollback(ctx, tx)

	// Create the row on first sight. A new schedule starts at "now" (no back-fill of
	// history nobody asked for) unless it says StartAt. The watermark is "the last slot
	// decided", so StartAt becomes a watermark just before it: slots are whole seconds and
	// the first slot is strictly after the watermark.
	var start *time.Time
	if !def.startAt.IsZero() {
		w := def.startAt.Add(-time.Microsecond).UTC()
		start = &w
	} else if clock != nil {
		start = clock
	}
	var created bool
	err = tx.QueryRow(ctx, `
		WITH ins AS (
			INSERT INTO stepwise_schedule (name, spec, zone, gap, misfire, overlap, shards, watermark)
			VALUES ($1, $2, $3, $4, $5, $6, $7, coalesce($8, now()))
			ON CONFLICT (name) DO NOTHING
			RETURNING name, watermark
		), ev AS (
			INSERT INTO stepwise_event (subject, kind, to_state, actor, detail)
			SELECT 'schedule:' || name, 'schedule.created', 'active', 'scheduler',
			       jsonb_build_object('definition', $9::jsonb, 'watermark', watermark) FROM ins
		)
		SELECT EXISTS (SELECT 1 FROM ins)`,
		def.name, def.specText, def.zone, gapName(def.gap), def.misfireDoc, def.overlap.String(), def.shards, start,
		def.describeJSON()).Scan(&created)
	if err != nil {
		return nil, fmt.Errorf("creating schedule row: %w", err)
	}
	st.Created = created

	var row storedSchedule
	err = tx.QueryRow(ctx, `
		SELECT spec, zone, gap, misfire, overlap, shards, watermark, paused, version, now()
		  FROM stepwise_schedule WHERE name = $1
		   FOR UPDATE SKIP LOCKED`, def.name).
		Scan(&row.spec, &row.zone, &row.gap, &row.misfire, &row.overlap, &row.shards, &row.watermark, &row.paused, &row.version, &row.dbNow)
	if errors.Is(err, pgx.ErrNoRows) {
		// Another tick holds the schedule. It decides every due slot; waiting for it and
		// then deciding again would only find nothing to do.
		st.Locked = true
		s.metrics.Ticks.WithLabelValues(def.name, "locked").Inc()
		return st, nil
	}
	if err != nil {
		return nil, fmt.Errorf("locking schedule row: %w", err)
	}
	now := row.dbNow.UTC()
	if clock != nil {
		now = *clock
	}

	version := row.version
	if changed, err := s.syncDefinition(ctx, tx, def, &row); err != nil {
		return nil, err
	} else if changed {
		st.Changed = true
		version++
	}

	if row.paused {
		if err := tx.Commit(ctx); err != nil {
			return nil, fmt.Errorf("committing tick: %w", err)
		}
		st.Paused, st.Watermark = true, row.watermark.UTC()
		s.metrics.Ticks.WithLabelValues(def.name, "paused").Inc()
		return st, nil
	}

	open, started, err := s.refreshOpenSlots(ctx, tx, def, now)
	if err != nil {
		return nil, err
	}

	decided, err := decidedAhead(ctx, tx, def.name, row.watermark)
	if err != nil {
		return nil, err
	}
	plan := planTick(def, row.watermark.UTC(), now, open, decided, s.cfg.MaxSlotsPerTick)
	if err := s.apply(ctx, client, tx, def, version, now, plan, st); err != nil {
		return nil, err
	}
	st.Watermark = plan.watermark
	if !plan.watermark.Equal(row.watermark) {
		if _, err := tx.Exec(ctx, `UPDATE stepwise_schedule SET watermark = $2, updated_at = now() WHERE name = $1`,
			def.name, plan.watermark); err != nil {
			return nil, fmt.Errorf("advancing watermark to %s: %w", fmtSlot(plan.watermark), err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("committing tick: %w", err)
	}

	s.observe(def, now, plan, started)
	s.metrics.Ticks.WithLabelValues(def.name, "ok").Inc()
	// The tick's work is durable now. A crash here must lose nothing and the next tick must
	// add nothing (fault drill 1: the insert committed, the caller never heard back).
	if err := faultpoint.Hit(faultpoint.TickAfterCommit); err != nil {
		return st, err
	}
	return st, nil
}

// describeJSON is the definition as recorded in audit events.
func (def *schedule) describeJSON() []byte {
	b, _ := json.Marshal(map[string]any{
		"spec": def.specText, "zone": def.zone, "gap": gapName(def.gap),
		"misfire": json.RawMessage(def.misfireDoc), "overlap": def.overlap.String(), "shards": def.shards,
	})
	return b
}

// syncDefinition updates the row to the definition registered in code when they differ,
// keeping the watermark (so a new spec takes effect from the next slot after it) and
// recording the old and new definition in a 'schedule.changed' event.
func (s *Scheduler) syncDefinition(ctx context.Context, tx pgx.Tx, def *schedule, row *storedSchedule) (bool, error) {
	var storedMisfire, codeMisfire any
	if err := json.Unmarshal(row.misfire, &storedMisfire); err != nil {
		return false, fmt.Errorf("decoding stored misfire policy %s: %w", row.misfire, err)
	}
	if err := json.Unmarshal(def.misfireDoc, &codeMisfire); err != nil {
		return false, err
	}
	if row.spec == def.specText && row.zone == def.zone && row.gap == gapName(def.gap) &&
		row.overlap == def.overlap.String() && row.shards == def.shards && reflect.DeepEqual(storedMisfire, codeMisfire) {
		return false, nil
	}
	old, _ := json.Marshal(map[string]any{
		"spec": row.spec, "zone": row.zone, "gap": row.gap, "misfire": row.misfire, "overlap": row.overlap, "shards": row.shards,
	})
	_, err := tx.Exec(ctx, `
		WITH u AS (
			UPDATE stepwise_schedule
			   SET spec = $2, zone = $3, gap = $4, misfire = $5, overlap = $6, shards = $7,
			       version = version + 1, updated_at = now()
			 WHERE name = $1
			RETURNING name, version, watermark
		)
		INSERT INTO stepwise_event (subject, kind, actor, detail)
		SELECT 'schedule:' || name, 'schedule.changed', 'scheduler',
		       jsonb_build_object('old', $8::jsonb, 'new', $9::jsonb, 'version', version,
		                          'watermark', watermark, 'effective', 'from the first slot after the watermark')
		  FROM u`,
		def.name, def.specText, def.zone, gapName(def.gap), def.misfireDoc, def.overlap.String(), def.shards, old, def.describeJSON())
	if err != nil {
		return false, fmt.Errorf("updating schedule definition: %w", err)
	}
	s.logger.InfoContext(ctx, "stepwise: schedule definition changed; effective from the next slot",
		"schedule", def.name, "old_spec", row.spec, "new_spec", def.specText, "watermark", row.watermark)
	return true, nil
}

// startedSlot is a slot whose runs were first claimed since the last tick looked.
type startedSlot struct {
	slot, at time.Time
}

// refreshOpenSlots returns the slots in flight (buffered, or materialized with unfinished
// runs), after marking materialized slots whose runs have all finished, and recording
// when each newly started slot's first run was first claimed (run start, for lag). Only
// slots in flight are read (a partial index), so the cost does not grow with history.
func (s *Scheduler) refreshOpenSlots(ctx context.Context, tx pgx.Tx, def *schedule, now time.Time) ([]openSlot, []startedSlot, error) {
	rows, err := tx.Query(ctx, `
		SELECT slot, status, started_at IS NULL FROM stepwise_schedule_slot
		 WHERE schedule = $1 AND (status = 'buffered' OR (status = 'materialized' AND runs_done_at IS NULL))
		 ORDER BY slot`, def.name)
	if err != nil {
		return nil, nil, fmt.Errorf("reading open slots: %w", err)
	}
	var open []openSlot
	var materialized, unstarted []time.Time
	for rows.Next() {
		var o openSlot
		var status string
		var notStarted bool
		if err := rows.Scan(&o.slot, &status, &notStarted); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("reading open slots: %w", err)
		}
		o.slot = o.slot.UTC()
		o.buffered = status == "buffered"
		if !o.buffered {
			materialized = append(materialized, o.slot)
			if notStarted {
				unstarted = append(unstarted, o.slot)
			}
		}
		open = append(open, o)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("reading open slots: %w", err)
	}
	if len(materialized) == 0 {
		return open, nil, nil
	}

	var started []startedSlot
	if len(unstarted) > 0 {
		rows, err := tx.Query(ctx, `
			UPDATE stepwise_schedule_slot sl SET started_at = f.first
			  FROM (SELECT r.slot, min(e.at) AS first
			          FROM stepwise_run r
			          JOIN stepwise_event e ON e.subject = r.key AND e.kind = 'lease.claim'
			         WHERE r.schedule = $1 AND r.slot = ANY($2)
			         GROUP BY r.slot) f
			 WHERE sl.schedule = $1 AND sl.slot = f.slot AND sl.started_at IS NULL
			RETURNING sl.slot, sl.started_at`, def.name, unstarted)
		if err != nil {
			return nil, nil, fmt.Errorf("recording slot start times: %w", err)
		}
		started, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (startedSlot, error) {
			var ss startedSlot
			err := row.Scan(&ss.slot, &ss.at)
			return ss, err
		})
		if err != nil {
			return nil, nil, fmt.Errorf("recording slot start times: %w", err)
		}
	}

	rows, err = tx.Query(ctx, `
		UPDATE stepwise_schedule_slot sl SET runs_done_at = $3
		 WHERE sl.schedule = $1 AND sl.slot = ANY($2)
		   AND NOT EXISTS (SELECT 1 FROM stepwise_run r
		                    WHERE r.schedule = $1 AND r.slot = sl.slot AND r.status IN ('pending', 'running'))
		RETURNING sl.slot`, def.name, materialized, now)
	if err != nil {
		return nil, nil, fmt.Errorf("marking finished slots: %w", err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		return nil, nil, fmt.Errorf("marking finished slots: %w", err)
	}
	open = slices.DeleteFunc(open, func(o openSlot) bool {
		return !o.buffered && slices.ContainsFunc(done, func(d time.Time) bool { return d.Equal(o.slot) })
	})
	return open, started, nil
}

// decidedAhead returns the slots after the watermark that are decided already: only
// StartSlot decides a slot ahead of the tick that reaches it. The tick passes over them
// (planTick). Guards against: deciding such a slot a second time by the misfire or overlap
// policy, which recorded it SKIPPED while the runs started by hand ran. Reads the primary
// key; there are as many rows as slots started early by hand.
func decidedAhead(ctx context.Context, tx pgx.Tx, schedule string, watermark time.Time) ([]time.Time, error) {
	rows, err := tx.Query(ctx, `SELECT slot FROM stepwise_schedule_slot WHERE schedule = $1 AND slot > $2 ORDER BY slot`, schedule, watermark)
	if err != nil {
		return nil, fmt.Errorf("reading slots decided ahead of the watermark: %w", err)
	}
	slots, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		return nil, fmt.Errorf("reading slots decided ahead of the watermark: %w", err)
	}
	for i := range slots {
		slots[i] = slots[i].UTC()
	}
	return slots, nil
}

// apply records the plan's decisions and starts the runs, in tx.
func (s *Scheduler) apply(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, def *schedule, version int, now time.Time, plan tickPlan, st *TickOutcome) error {
	// Cancellation first, in the same transaction as the decision that needs it: a tick
	// that crashes before commit neither cancels nor buffers.
	if len(plan.cancel) > 0 {
		reason := fmt.Sprintf("schedule %q: a newer slot is due (OverlapCancelOther)", def.name)
		rows, err := tx.Query(ctx, `SELECT key FROM stepwise_run
			WHERE schedule = $1 AND slot = ANY($2) AND status IN ('pending', 'running') AND cancel_requested_at IS NULL
			ORDER BY key`, def.name, plan.cancel)
		if err != nil {
			return fmt.Errorf("finding runs to cancel: %w", err)
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("finding runs to cancel: %w", err)
		}
		for _, k := range keys {
			if err := workflow.CancelRun(ctx, tx, k, reason); err != nil {
				return err
			}
		}
		st.CancelRequested = keys
	}

	var skipSlots []time.Time
	var skipReasons, skipDetails []string
	for _, d := range plan.decisions {
		switch d.action {
		case actSkip:
			skipSlots = append(skipSlots, d.slot)
			skipReasons = append(skipReasons, d.reason)
			skipDetails = append(skipDetails, d.detail)
			st.Skipped = append(st.Skipped, SkippedSlot{Slot: d.slot, Reason: d.reason})
		case actSupersede:
			if _, err := tx.Exec(ctx, `UPDATE stepwise_schedule_slot SET status = 'skipped', reason = $3, detail = $4
				WHERE schedule = $1 AND slot = $2 AND status = 'buffered'`, def.name, d.slot, d.reason, d.detail); err != nil {
				return fmt.Errorf("superseding buffered slot %s: %w", fmtSlot(d.slot), err)
			}
			st.Skipped = append(st.Skipped, SkippedSlot{Slot: d.slot, Reason: d.reason})
		case actBuffer:
			if _, err := tx.Exec(ctx, `INSERT INTO stepwise_schedule_slot (schedule, slot, status, detail, shards, version, created_at)
				VALUES ($1, $2, 'buffered', $3, $4, $5, $6)`, def.name, d.slot, d.detail, def.shards, version, now); err != nil {
				return fmt.Errorf("recording buffered slot %s: %w", fmtSlot(d.slot), err)
			}
			st.Buffered = append(st.Buffered, d.slot)
		case actMaterialize, actPromote:
			// A plain INSERT for a new slot: a second decision of the same slot must fail
			// loudly, never be absorbed. A promotion moves the buffered row on.
			var err error
			if d.action == actMaterialize {
				_, err = tx.Exec(ctx, `INSERT INTO stepwise_schedule_slot (schedule, slot, status, shards, version, created_at, materialized_at)
					VALUES ($1, $2, 'materialized', $3, $4, $5, $5)`, def.name, d.slot, def.shards, version, now)
			} else {
				_, err = tx.Exec(ctx, `UPDATE stepwise_schedule_slot SET status = 'materialized', detail = NULL, shards = $3, version = $4, materialized_at = $5
					WHERE schedule = $1 AND slot = $2 AND status = 'buffered'`, def.name, d.slot, def.shards, version, now)
			}
			if err != nil {
				return fmt.Errorf("recording slot %s: %w", fmtSlot(d.slot), err)
			}
			for shard := range def.shards {
				created, err := def.start(ctx, client, tx, d.slot, shard)
				if err != nil {
					return fmt.Errorf("starting run of slot %s shard %d: %w", fmtSlot(d.slot), shard, err)
				}
				if created {
					st.RunsStarted++
				}
			}
			st.Materialized = append(st.Materialized, d.slot)
		}
	}
	if len(skipSlots) > 0 {
		// One statement for any number of skipped slots: a long outage under RunLatest can
		// skip thousands at once.
		if _, err := tx.Exec(ctx, `
			INSERT INTO stepwise_schedule_slot (schedule, slot, status, reason, detail, shards, version, created_at)
			SELECT $1, s.slot, 'skipped', s.reason, s.detail, $5, $6, $7
			  FROM unnest($2::timestamptz[], $3::text[], $4::text[]) AS s(slot, reason, detail)`,
			def.name, skipSlots, skipReasons, skipDetails, def.shards, version, now); err != nil {
			return fmt.Errorf("recording %d skipped slots: %w", len(skipSlots), err)
		}
	}
	if len(st.Skipped) > 0 {
		// One audit row per tick that skipped, not per slot.
		counts := map[string]int{}
		for _, sk := range st.Skipped {
			counts[sk.Reason]++
		}
		if _, err := tx.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, actor, detail)
			VALUES ('schedule:' || $1, 'schedule.skipped', 'scheduler',
			        jsonb_build_object('count', $2::int, 'first', $3::timestamptz, 'last', $4::timestamptz, 'reasons', $5::jsonb))`,
			def.name, len(st.Skipped), st.Skipped[0].Slot, st.Skipped[len(st.Skipped)-1].Slot, counts); err != nil {
			return fmt.Errorf("auditing skipped slots: %w", err)
		}
	}
	return nil
}

// observe updates the metrics for a committed tick.
func (s *Scheduler) observe(def *schedule, now time.Time, plan tickPlan, started []startedSlot) {
	m := s.metrics
	// A slot decided more than two tick intervals after its time was missed by the ticks
	// that should have decided it (an outage, a deploy, a paused schedule).
	misfireAfter := 2 * s.cfg.TickInterval
	for _, d := range plan.decisions {
		if d.action == actSupersede || d.action == actPromote {
			continue
		}
		if now.Sub(d.slot) > misfireAfter {
			m.Misfires.WithLabelValues(def.name).Inc()
		}
	}
	for _, d := range plan.decisions {
		switch d.action {
		case actSkip, actSupersede:
			m.SkippedSlots.WithLabelValues(def.name, d.reason).Inc()
		case actBuffer:
			m.Slots.WithLabelValues(def.name, "buffered").Inc()
		case actMaterialize, actPromote:
			m.Slots.WithLabelValues(def.name, "materialized").Inc()
			m.MaterializeLag.WithLabelValues(def.name).Observe(now.Sub(d.slot).Seconds())
		}
	}
	for _, ss := range started {
		m.StartLag.WithLabelValues(def.name).Observe(ss.at.Sub(ss.slot).Seconds())
	}
}
