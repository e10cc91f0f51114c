package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/bankfake"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/retention"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// Retention makes a chaos run a retention soak: retention.Prune runs in a loop beside the
// chaos with an age of seconds (its clock moved ahead, since Config.OlderThan is at least a
// day), and an operator resolves payouts by hand on the bank's evidence, so that decisions are
// made, and pruned around, while runs step and payouts move. At rest the operator decides what
// is left, Prune runs once more with an age of zero, and the run is judged by the retention
// checks (NameKeyRestarts, NameSlotEvidence, NameDecisionLost) besides every other invariant.
//
// Every event Prune deletes is copied aside by a trigger (the soak's own, not the SDK's) and
// put back before the other invariants are checked: they judge what the system did, from its
// whole trail, and the retention checks judge what Prune kept.
type Retention struct {
	// Age is how old finished history must be to go during the chaos. Defaults to 2s.
	Age time.Duration
	// Every is the pause between passes. Defaults to 1s.
	Every time.Duration
}

// Names of the retention checks (Violation.Name).
const (
	NameKeyRestarts  = "retention: no run key restarts from zero (Start of every used key returns its run)"
	NameSlotEvidence = "retention: no slot evidence lost (each date's batch status and runs as before the prune; starting it again starts nothing)"
	NameDecisionLost = "retention: every manual decision still attributable (who, what, why), none ever deleted"
)

// RetentionReport counts what the soak's pruning and operator did.
type RetentionReport struct {
	Passes                                  int
	PrunedRuns, RunEvents, OperationEvents  int64
	Decisions, DecisionsRefused, PruneFails int
}

func (r *RetentionReport) String() string {
	return fmt.Sprintf("retention: %d passes pruned the history of %d runs, %d run events and %d operation events (%d passes failed); operator: %d decisions (%d refused as stale)",
		r.Passes, r.PrunedRuns, r.RunEvents, r.OperationEvents, r.PruneFails, r.Decisions, r.DecisionsRefused)
}

// decision is one resolution the soak's operator recorded.
type decision struct {
	id            uuid.UUID
	to            outbox.State
	actor, reason string
}

// retentionSoak is the pruner and operator of one run.
type retentionSoak struct {
	cfg  Retention
	pool *pgxpool.Pool
	bank *fakebank.Client
	svc  *settlement.Service // nil for the steps workload: no payouts to decide
	logf func(string, ...any)

	mu        sync.Mutex
	report    RetentionReport
	decisions []decision
	// used holds every run key seen before a prune, with its workflow and input: a key
	// Prune made the database forget would otherwise not be checked at all.
	used map[string]runRow

	stop chan struct{}
	done chan struct{}
}

// archiveSQL copies every event Prune deletes aside, so that the invariants can be checked
// on the whole trail afterwards; restoreSQL puts them back (with their ids) and removes it.
const archiveSQL = `
CREATE TABLE chaos_pruned_event (LIKE stepwise_event);
CREATE FUNCTION chaos_archive_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO chaos_pruned_event SELECT OLD.*;
	RETURN OLD;
END $$;
CREATE TRIGGER chaos_archive_event AFTER DELETE ON stepwise_event FOR EACH ROW EXECUTE FUNCTION chaos_archive_event();`

const restoreSQL = `
DROP TRIGGER chaos_archive_event ON stepwise_event;
DROP FUNCTION chaos_archive_event();
INSERT INTO stepwise_event OVERRIDING SYSTEM VALUE SELECT * FROM chaos_pruned_event;
DROP TABLE chaos_pruned_event;`

func newRetentionSoak(ctx context.Context, pool *pgxpool.Pool, cfg *Config, bank *fakebank.Client, plan settlement.Plan) (*retentionSoak, error) {
	r := *cfg.Retention
	if r.Age == 0 {
		r.Age = 2 * time.Second
	}
	if r.Every == 0 {
		r.Every = time.Second
	}
	s := &retentionSoak{cfg: r, pool: pool, bank: bank, logf: cfg.Logf, stop: make(chan struct{}), done: make(chan struct{}),
		used: map[string]runRow{}}
	if cfg.Workload == "settle" {
		svc, err := settlement.NewService(pool, &settlement.ServiceConfig{Bank: bankfake.New(bank), Plan: plan,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			return nil, fmt.Errorf("chaos: the operator's service: %w", err)
		}
		s.svc = svc
	}
	if _, err := pool.Exec(ctx, archiveSQL); err != nil {
		return nil, fmt.Errorf("chaos: installing the pruned-event archive: %w", err)
	}
	return s, nil
}

// runRow is a run's key, workflow and input.
type runRow struct {
	key, workflow string
	input         json.RawMessage
}

// prune runs one pass with history older than age going, after noting the keys in use.
func (s *retentionSoak) prune(ctx context.Context, age time.Duration) error {
	rows, err := s.pool.Query(ctx, `SELECT key, workflow, input FROM stepwise_run`)
	if err != nil {
		return err
	}
	runs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (runRow, error) {
		var r runRow
		err := row.Scan(&r.key, &r.workflow, &r.input)
		return r, err
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	for _, r := range runs {
		s.used[r.key] = r
	}
	s.mu.Unlock()
	res, err := retention.Prune(ctx, s.pool, &retention.Config{
		OlderThan: retention.MinAge,
		Now:       func() time.Time { return time.Now().Add(retention.MinAge - age) },
		Pause:     time.Millisecond,
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	s.report.Passes++
	if res != nil {
		s.report.PrunedRuns += res.Runs
		s.report.RunEvents += res.RunEvents
		s.report.OperationEvents += res.OperationEvents
	}
	if err != nil {
		s.report.PruneFails++
	}
	return err
}

// start runs the pruner and the operator until finish.
func (s *retentionSoak) start(ctx context.Context) {
	go func() {
		defer close(s.done)
		t := time.NewTicker(s.cfg.Every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.stop:
				return
			case <-t.C:
			}
			if err := s.prune(ctx, s.cfg.Age); err != nil && ctx.Err() == nil {
				s.logf("chaos: retention pass failed: %v", err)
			}
			if err := s.decide(ctx); err != nil && ctx.Err() == nil {
				s.logf("chaos: operator: %v", err)
			}
		}
	}()
}

// decide resolves a few payouts the machines have not settled (MANUAL, UNKNOWN_EXTERNAL) for
// which the bank holds a payment: SUCCEEDED when it paid, FAILED_PERMANENT when it declined,
// as a person reading the bank's back office would. A payout the bank has no record of is
// left to the reconciler (a request may still land).
func (s *retentionSoak) decide(ctx context.Context) error {
	if s.svc == nil {
		return nil
	}
	rows, err := s.pool.Query(ctx, `SELECT operation_id, state, version FROM stepwise_operation
		WHERE kind = $1 AND state IN ('MANUAL', 'UNKNOWN_EXTERNAL') ORDER BY updated_at LIMIT 3`, settlement.PayoutKind)
	if err != nil {
		return err
	}
	type open struct {
		id      uuid.UUID
		state   outbox.State
		version int64 // what the operator read: the decision is on it
	}
	ops, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (open, error) {
		var o open
		err := row.Scan(&o.id, &o.state, &o.version)
		return o, err
	})
	if err != nil {
		return err
	}
	for _, o := range ops {
		p, err := s.bank.Lookup(ctx, o.id.String())
		if err != nil {
			continue // not found, or the bank failed the lookup: not evidence
		}
		to := outbox.StateSucceeded
		switch p.Status {
		case fakebank.StatusSucceeded:
		case fakebank.StatusFailed:
			to = outbox.StateFailedPermanent
		default:
			continue
		}
		s.mu.Lock()
		n := s.report.Decisions + s.report.DecisionsRefused + 1
		s.mu.Unlock()
		d := decision{id: o.id, to: to, actor: "soak-operator",
			reason: fmt.Sprintf("soak decision %d: the bank holds payment %s as %s", n, p.ID, p.Status)}
		_, err = settlement.Resolve(ctx, s.svc.Client, settlement.Resolution{
			OperationID: d.id, From: o.state, SeenVersion: o.version, To: d.to, Actor: d.actor, Reason: d.reason})
		s.mu.Lock()
		if err == nil {
			s.report.Decisions++
			s.decisions = append(s.decisions, d)
		} else {
			// Moved since read (the reconciler settled it first): a refused decision
			// records nothing, as it should.
			s.report.DecisionsRefused++
		}
		s.mu.Unlock()
	}
	return nil
}

// rawArgs starts a run of any workflow with its stored input, to ask Start whether a key is
// still used.
type rawArgs struct {
	kind string
	raw  json.RawMessage
}

func (a rawArgs) Kind() string                 { return a.kind }
func (a rawArgs) MarshalJSON() ([]byte, error) { return a.raw, nil }

// evidence is what the slot checks compare before and after the last prune.
type evidence struct {
	reports map[string]string // date -> batch status and runs
	slots   map[string]string // schedule/slot -> status
}

func (s *retentionSoak) evidence(ctx context.Context, plan settlement.Plan, dates []time.Time) (*evidence, error) {
	ev := &evidence{reports: map[string]string{}, slots: map[string]string{}}
	if s.svc != nil {
		for _, d := range dates {
			rep, err := settlement.BuildReport(ctx, s.pool, nil, plan, d)
			if err != nil {
				return nil, err
			}
			ev.reports[d.Format(time.DateOnly)] = fmt.Sprintf("%s runs %v", rep.Batch, rep.Runs)
		}
	}
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT schedule FROM stepwise_schedule_slot`)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	operator, err := stepwise.NewOperatorClient(s.pool)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		reps, err := operator.SlotList(ctx, name, &stepwise.SlotListParams{Limit: 1000})
		if err != nil {
			return nil, err
		}
		for _, r := range reps {
			ev.slots[name+"/"+r.Slot.Format(time.RFC3339)] = fmt.Sprintf("%s runs %v", r.Status, r.Runs)
		}
	}
	return ev, nil
}

// finish stops the loop, lets the operator decide what is left, prunes everything finished,
// checks what Prune kept, and puts the pruned events back for the other checks.
func (s *retentionSoak) finish(ctx context.Context, inserter *river.Client[pgx.Tx], plan settlement.Plan, dates []time.Time) ([]workflowtest.Violation, error) {
	close(s.stop)
	<-s.done
	if err := s.decide(ctx); err != nil {
		return nil, err
	}
	before, err := s.evidence(ctx, plan, dates)
	if err != nil {
		return nil, fmt.Errorf("chaos: slot evidence before the last prune: %w", err)
	}
	if err := s.prune(ctx, 0); err != nil {
		return nil, fmt.Errorf("chaos: the last prune: %w", err)
	}
	var out []workflowtest.Violation
	add := func(name, format string, args ...any) {
		out = append(out, workflowtest.Violation{Name: name, Evidence: fmt.Sprintf(format, args...)})
	}

	// No key restarts from zero: Start of every key ever used, with its own input, returns
	// the run (in a transaction rolled back, so that a failure here starts nothing).
	for _, r := range s.used {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		run, err := workflow.StartTx(ctx, inserter, tx, r.key, rawArgs{kind: r.workflow, raw: r.input}, nil)
		_ = tx.Rollback(ctx)
		switch {
		case err != nil:
			add(NameKeyRestarts, "Start of used key %q: %v", r.key, err)
		case run.Created:
			add(NameKeyRestarts, "Start of used key %q created a new run from cursor zero", r.key)
		}
	}
	var pruned, empty int
	if err := s.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE c.steps = 0 OR c.cursor IS NULL)
		FROM stepwise_run r JOIN stepwise_checkpoint c USING (key) WHERE r.history_pruned_at IS NOT NULL`).Scan(&pruned, &empty); err != nil {
		return nil, err
	}
	if empty > 0 {
		add(NameKeyRestarts, "%d of the %d runs whose history was pruned lost their committed cursor", empty, pruned)
	}

	// No slot evidence lost: every date's status and runs as before, and starting it again
	// starts nothing.
	after, err := s.evidence(ctx, plan, dates)
	if err != nil {
		return nil, fmt.Errorf("chaos: slot evidence after the last prune: %w", err)
	}
	for k, v := range before.reports {
		if after.reports[k] != v {
			add(NameSlotEvidence, "date %s was %s before the prune, %s after", k, v, after.reports[k])
		}
	}
	for k, v := range before.slots {
		if after.slots[k] != v {
			add(NameSlotEvidence, "slot %s was %s before the prune, %q after", k, v, after.slots[k])
		}
	}
	if s.svc != nil {
		for _, d := range dates {
			err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				_, created, err := plan.Start(ctx, inserter, tx, d, "retention soak")
				if err == nil && created {
					add(NameSlotEvidence, "date %s: starting it again after the prune started runs", d.Format(time.DateOnly))
				}
				return errRollback
			})
			if err != nil && !errors.Is(err, errRollback) {
				add(NameSlotEvidence, "date %s: starting it again after the prune: %v", d.Format(time.DateOnly), err)
			}
		}
	}

	// Every manual decision attributable: each the operator made still shows who, what and
	// why, and no person's decision was ever among the events Prune deleted.
	for _, d := range s.decisions {
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event WHERE subject = 'op:' || $1::text
			AND kind = 'op.transition' AND to_state = $2 AND actor = $3 AND detail->>'reason' = $4 AND detail->>'resolution' = 'manual'`,
			d.id, string(d.to), d.actor, d.reason).Scan(&n); err != nil {
			return nil, err
		}
		if n != 1 {
			add(NameDecisionLost, "payout %s: %s's decision %s (%q) is not in the audit trail", d.id, d.actor, d.to, d.reason)
		}
	}
	var deleted int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM chaos_pruned_event e WHERE e.kind IN ('console.action', 'run.resume', 'run.cancel_requested')
		OR (e.kind = 'op.transition' AND (e.to_state = 'MANUAL' OR e.detail->>'resolution' = 'manual'))`).Scan(&deleted); err != nil {
		return nil, err
	}
	if deleted > 0 {
		add(NameDecisionLost, "%d events recording a person's decision (or what it was made on) were pruned", deleted)
	}
	s.logf("chaos: %s; %d runs with their history pruned, %d keys checked", s.Report(), pruned, len(s.used))

	if _, err := s.pool.Exec(ctx, restoreSQL); err != nil {
		return nil, fmt.Errorf("chaos: restoring the pruned events: %w", err)
	}
	return out, nil
}

var errRollback = errors.New("rolled back on purpose")

// Report is the soak's counts so far.
func (s *retentionSoak) Report() *RetentionReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.report
	return &r
}
