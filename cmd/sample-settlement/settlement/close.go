package settlement

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise/stepwisetype"
	"github.com/stepwise-go/stepwise/workflow"
)

// Closing a date and reconciling it with the bank's statement, with Stepwise's waits
// (docs/design.md, "Waits in the sample"):
//
//  1. Each settle run of the date (one per shard), after its last batch, waits for its own
//     payouts to be at rest: workflow.WaitForOperations, holding no worker. A MANUAL payout
//     is not at rest: the run waits until a person resolves it (resolve, or the console).
//  2. The step after the wait records the shard in settlement_day_shard. The run that
//     records the date's last shard closes the date in the same transaction: it checks again
//     that every payout of the date is SUCCEEDED or FAILED_PERMANENT, writes the day's
//     report into settlement_day, and starts the date's reconciliation run.
//  3. The reconciliation run waits for the bank's statement: workflow.WaitForSignal, sent by
//     "statement-arrived --date D" or serve's POST /ops/statement. A statement that arrives
//     before the date closed is kept for it (a signal is durable, even before its run
//     exists), and one sent twice under one id counts once. It then starts one run per
//     currency (Step.StartChild), each comparing its currency of the ledger with the
//     statement (BuildReport), waits for them (workflow.WaitForChildren) and records the
//     date's result on settlement_day.
//
// Why the last shard closes the date, and not a parent run waiting for the shard runs
// (workflow.WaitForChildren): the schedule starts a date's shard runs itself, one run per
// shard key, and the shard runs and their keys are what every report, progress display and
// the lab already read. A parent would have to start them (Step.StartChild) to be able to
// wait for them, which changes who starts a date. A shard's own wait is the natural unit
// anyway: WaitForOperations waits for the operations of the run that enqueued them, so each
// shard waits for exactly its own payouts, and the last one to be at rest, serialized on
// the date's settlement_day row, closes the date.

// PayoutsAtRestTimeoutDefault is how long the sample's commands let a settle run wait for
// its payouts (ServiceConfig.PayoutsAtRestTimeout). A payment batch that is not proven
// within 6 hours needs a person; see "Behaviour on timeout" at settleWait.
const PayoutsAtRestTimeoutDefault = 6 * time.Hour

// statementTimeout is how long a reconciliation run waits for the bank's statement before
// it marks the date's statement overdue (and keeps waiting). Banks send the previous day's
// statement in the morning; two days late needs a person.
const statementTimeout = 48 * time.Hour

// statementSignal is the signal the reconciliation run waits for.
const statementSignal = "statement"

// settleWait is what a settle run does after its last batch, and at each timeout of the
// wait. Behaviour on timeout: some payouts are still not proven after timeout (the bank is
// down, or a payout is MANUAL and nobody resolved it): the date is marked overdue
// (settlement_day.overdue_at, shown by report) and the run waits again, for as long again.
// It does not fail: a failed run would need a resume once the payouts are proven, and
// closing the date without them would state something false.
func settleWait(timeout time.Duration) workflow.Next {
	if timeout <= 0 {
		timeout = PayoutsAtRestTimeoutDefault
	}
	return workflow.WaitForOperations(timeout)
}

// closeShard is the step after a settle run's wait for its payouts, in the step's
// transaction.
func closeShard(ctx context.Context, s *workflow.Step[SettleArgs, SettleCursor], date time.Time, timeout time.Duration) (workflow.Next, error) {
	wk := s.Woken()
	// The date's row, locked: the shard runs of a date close it one after another, so the
	// last one sees every other shard's row (each statement of the step's READ COMMITTED
	// transaction sees what committed before it).
	var closed bool
	if err := s.Tx.QueryRow(ctx, `INSERT INTO settlement_day (settle_date, shards) VALUES ($1, $2)
		ON CONFLICT (settle_date) DO UPDATE SET shards = settlement_day.shards RETURNING closed_at IS NOT NULL`,
		date, s.Args.Shards).Scan(&closed); err != nil {
		return workflow.Next{}, fmt.Errorf("locking the day %s: %w", date.Format(time.DateOnly), err)
	}
	if wk.TimedOut {
		if _, err := s.Tx.Exec(ctx, `UPDATE settlement_day SET overdue_at = coalesce(overdue_at, now()) WHERE settle_date = $1`, date); err != nil {
			return workflow.Next{}, fmt.Errorf("marking %s overdue: %w", date.Format(time.DateOnly), err)
		}
		return settleWait(timeout), nil
	}
	if _, err := s.Tx.Exec(ctx, `INSERT INTO settlement_day_shard (settle_date, shard, run_key) VALUES ($1, $2, $3)
		ON CONFLICT (settle_date, shard) DO NOTHING`, date, s.Args.Shard, s.RunKey); err != nil {
		return workflow.Next{}, fmt.Errorf("recording shard %d of %s at rest: %w", s.Args.Shard, date.Format(time.DateOnly), err)
	}
	var keys []string
	if err := s.Tx.QueryRow(ctx, `SELECT coalesce(array_agg(run_key ORDER BY shard), '{}') FROM settlement_day_shard WHERE settle_date = $1`,
		date).Scan(&keys); err != nil {
		return workflow.Next{}, fmt.Errorf("reading the shards of %s: %w", date.Format(time.DateOnly), err)
	}
	if closed || len(keys) < s.Args.Shards {
		return workflow.Done(), nil
	}
	// The last shard: prove the whole date again, from the ledger and from the settlements,
	// in this transaction, before stating that it is closed.
	var open, unpaid int
	if err := s.Tx.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM stepwise_operation WHERE run_key = ANY($2) AND kind = $3 AND $4 IN (split_part(business_key, '/', 1), split_part(business_key, '/', 2))
		    AND state NOT IN ('SUCCEEDED', 'FAILED_PERMANENT')),
		(SELECT count(*) FROM settlement WHERE settle_date = $1 AND status NOT IN ('PAID', 'PAYOUT_FAILED'))`,
		date, keys, PayoutKind, date.Format(time.DateOnly)).Scan(&open, &unpaid); err != nil {
		return workflow.Next{}, fmt.Errorf("checking the payouts of %s: %w", date.Format(time.DateOnly), err)
	}
	if open > 0 || unpaid > 0 {
		// Every shard's wait held, so this is a payout outside any shard's run, or a bug:
		// refuse to close, and retry (the step's error is retried with backoff, visibly).
		return workflow.Next{}, fmt.Errorf("closing %s: %d payouts not at rest and %d settlements neither PAID nor PAYOUT_FAILED, though every shard's payouts are",
			date.Format(time.DateOnly), open, unpaid)
	}
	if _, err := s.Tx.Exec(ctx, closeDaySQL, date); err != nil {
		return workflow.Next{}, fmt.Errorf("closing %s: %w", date.Format(time.DateOnly), err)
	}
	// A run of its own, not a child: cancelling or resuming a settle shard must not reach the
	// day's reconciliation. It exists exactly when this step commits.
	if _, err := s.StartRun(ctx, ReconcileRunKey(date), reconcileArgs{Date: date.Format(time.DateOnly)}, nil); err != nil {
		return workflow.Next{}, fmt.Errorf("starting the reconciliation of %s: %w", date.Format(time.DateOnly), err)
	}
	return workflow.Done(), nil
}

// closeDaySQL closes a date: its report, per currency, from the settlements (whose status
// moves with their payouts in the same transaction).
const closeDaySQL = `
UPDATE settlement_day SET closed_at = now(), report = (
	SELECT coalesce(jsonb_agg(jsonb_build_object('currency', currency, 'settlements', n, 'settled', settled,
	       'paid', jsonb_build_object('count', paid_n, 'sum', paid), 'declined', jsonb_build_object('count', declined_n, 'sum', declined))
	       ORDER BY currency), '[]')
	  FROM (SELECT currency, count(*) AS n, sum(amount)::bigint AS settled,
	               count(*) FILTER (WHERE status = 'PAID') AS paid_n, coalesce(sum(amount) FILTER (WHERE status = 'PAID'), 0)::bigint AS paid,
	               count(*) FILTER (WHERE status = 'PAYOUT_FAILED') AS declined_n,
	               coalesce(sum(amount) FILTER (WHERE status = 'PAYOUT_FAILED'), 0)::bigint AS declined
	          FROM settlement WHERE settle_date = $1 GROUP BY currency) c)
WHERE settle_date = $1 AND closed_at IS NULL`

// ReconcileRunKey is the key of the run that reconciles date with the bank's statement:
// "reconcile/<date>".
func ReconcileRunKey(date time.Time) string { return "reconcile/" + date.Format(time.DateOnly) }

// reconcileArgs is the input of a date's reconciliation run.
type reconcileArgs struct {
	Date string `json:"date"`
}

func (reconcileArgs) Kind() string                 { return "reconcile_statement" }
func (reconcileArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: SettleQueue} }

// reconcileCursor is what the reconciliation run keeps between its steps: the statement it
// took, once it took one (its currency runs exist from then on).
type reconcileCursor struct {
	StatementID string `json:"statement_id,omitempty"`
}

// currencyTimeout is how long the reconciliation run waits for its currency runs at a
// time; they compare a statement each, in seconds, unless the bank cannot be asked.
const currencyTimeout = time.Hour

// reconcileWorker waits for the bank's statement of a closed date, then reconciles each
// currency in a run of its own (one nostro account, one statement line per currency at a
// real bank: a difference in one currency is investigated, and re-run, apart from the
// others), waits for them (workflow.WaitForChildren) and records the date's result.
type reconcileWorker struct {
	workflow.StepperDefaults[reconcileArgs, reconcileCursor]
	pool *pgxpool.Pool
}

func (w *reconcileWorker) Step(ctx context.Context, s *workflow.Step[reconcileArgs, reconcileCursor]) (workflow.Next, error) {
	date, err := ParseDate(s.Args.Date)
	if err != nil {
		return workflow.Fail(err), nil
	}
	wk := s.Woken()
	switch {
	case wk == nil && s.Cursor.StatementID != "":
		// Resumed after a currency run failed (its resume resumed it too): wait for them again.
		return workflow.WaitForChildren(currencyTimeout), nil
	case wk == nil:
		return workflow.WaitForSignal(statementSignal, statementTimeout), nil
	case wk.Kind == workflow.WaitSignal && wk.TimedOut:
		// No statement after two days: visible on the date (report), and the run waits on.
		if _, err := s.Tx.Exec(ctx, `UPDATE settlement_day SET overdue_at = coalesce(overdue_at, now()) WHERE settle_date = $1`, date); err != nil {
			return workflow.Next{}, err
		}
		return workflow.WaitForSignal(statementSignal, statementTimeout), nil
	case wk.Kind == workflow.WaitSignal:
		s.Cursor.StatementID = wk.Signal.ID
		var currencies []string
		if err := s.Tx.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT currency ORDER BY currency), '{}') FROM settlement WHERE settle_date = $1`,
			date).Scan(&currencies); err != nil {
			return workflow.Next{}, fmt.Errorf("listing the currencies of %s: %w", s.Args.Date, err)
		}
		for _, cur := range currencies {
			if _, err := s.StartChild(ctx, s.RunKey+"/"+cur, reconcileCurrencyArgs{Date: s.Args.Date, Currency: cur}, nil); err != nil {
				return workflow.Next{}, err
			}
		}
		if len(currencies) == 0 {
			return w.record(ctx, s, date)
		}
		return workflow.WaitForChildren(currencyTimeout), nil
	case wk.TimedOut:
		return workflow.WaitForChildren(currencyTimeout), nil
	}
	var failed []string
	for key, st := range wk.Children {
		if st != workflow.RunStatusSucceeded {
			failed = append(failed, key+" "+string(st))
		}
	}
	if len(failed) > 0 {
		slices.Sort(failed) // the same message for the same failure, whatever the map's order
		return workflow.Fail(fmt.Errorf("reconciling %s: currency runs did not succeed (%s); resume %s once the cause is fixed (it resumes them, except one that failed again after it: resume that one on its own)",
			s.Args.Date, strings.Join(failed, ", "), s.RunKey)), nil
	}
	return w.record(ctx, s, date)
}

// record writes the date's reconciliation from its currencies' results.
func (w *reconcileWorker) record(ctx context.Context, s *workflow.Step[reconcileArgs, reconcileCursor], date time.Time) (workflow.Next, error) {
	tag, err := s.Tx.Exec(ctx, `UPDATE settlement_day d SET statement_id = $2, reconciled_at = now(),
		statement_match = coalesce((SELECT bool_and(statement_match) FROM settlement_day_currency c WHERE c.settle_date = d.settle_date), true),
		differences = coalesce((SELECT sum(differences)::int FROM settlement_day_currency c WHERE c.settle_date = d.settle_date), 0)
		WHERE settle_date = $1 AND closed_at IS NOT NULL`, date, s.Cursor.StatementID)
	if err != nil {
		return workflow.Next{}, fmt.Errorf("recording the reconciliation of %s: %w", s.Args.Date, err)
	}
	if tag.RowsAffected() != 1 {
		return workflow.Fail(fmt.Errorf("reconciling %s: the date is not closed", s.Args.Date)), nil
	}
	return workflow.Done(), nil
}

// reconcileCurrencyArgs is the input of one currency's reconciliation run, a child of the
// date's.
type reconcileCurrencyArgs struct {
	Date     string `json:"date"`
	Currency string `json:"currency"`
}

func (reconcileCurrencyArgs) Kind() string { return "reconcile_statement_currency" }
func (reconcileCurrencyArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: SettleQueue}
}

// reconcileCurrencyWorker compares one currency of a date with the bank's statement.
type reconcileCurrencyWorker struct {
	workflow.StepperDefaults[reconcileCurrencyArgs, reconcileCursor]
	pool *pgxpool.Pool
	bank Bank
	plan Plan
}

func (w *reconcileCurrencyWorker) Step(ctx context.Context, s *workflow.Step[reconcileCurrencyArgs, reconcileCursor]) (workflow.Next, error) {
	date, err := ParseDate(s.Args.Date)
	if err != nil {
		return workflow.Fail(err), nil
	}
	// The comparison reads the bank's statement and the ledger (BuildReport); the step's
	// transaction only records it. A bank that cannot be asked is an error: the step is
	// retried with backoff.
	rep, err := BuildReport(ctx, w.pool, w.bank, w.plan, date)
	if err != nil {
		return workflow.Next{}, err
	}
	if rep.BankError != "" {
		return workflow.Next{}, fmt.Errorf("reconciling %s %s: %s", s.Args.Date, s.Args.Currency, rep.BankError)
	}
	match, diffs := true, 0
	for _, t := range rep.Totals {
		if t.Currency == s.Args.Currency {
			match = t.Match
		}
	}
	for _, d := range rep.Differences {
		if d.Currency == s.Args.Currency {
			diffs++
		}
	}
	if _, err := s.Tx.Exec(ctx, `INSERT INTO settlement_day_currency (settle_date, currency, statement_match, differences) VALUES ($1, $2, $3, $4)
		ON CONFLICT (settle_date, currency) DO UPDATE SET statement_match = excluded.statement_match, differences = excluded.differences, reconciled_at = now()`,
		date, s.Args.Currency, match && diffs == 0, diffs); err != nil {
		return workflow.Next{}, fmt.Errorf("recording the reconciliation of %s %s: %w", s.Args.Date, s.Args.Currency, err)
	}
	return workflow.Done(), nil
}

// StatementArrived tells the reconciliation run of date that the bank's statement arrived:
// a durable signal, kept if the run does not wait yet (or does not exist yet: the date is
// not closed). id identifies the statement: sent again with the same id (a retried request)
// it counts once. Empty id: "bank-statement/<date>", one statement per date.
func StatementArrived(ctx context.Context, pool *pgxpool.Pool, date time.Time, id string) error {
	if date.IsZero() {
		return errors.New("StatementArrived: date is zero")
	}
	if id == "" {
		id = "bank-statement/" + date.Format(time.DateOnly)
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return workflow.Signal(ctx, tx, ReconcileRunKey(date), statementSignal, id,
			map[string]string{"date": date.Format(time.DateOnly), "statement_id": id})
	})
}

// Day is a business date's close and reconciliation, as settlement_day records them.
type Day struct {
	Date string `json:"date"`
	// Shards is the date's shard count; AtRest how many shards have their payouts at rest.
	Shards int `json:"shards"`
	AtRest int `json:"at_rest"`
	// OverdueAt is when a wait of the date (payouts, statement) first timed out.
	OverdueAt *time.Time `json:"overdue_at,omitempty"`
	// ClosedAt is when the date was closed: every payout proven.
	ClosedAt *time.Time `json:"closed_at,omitempty"`
	// StatementID, ReconciledAt, Match and Differences are the reconciliation's result.
	StatementID  string     `json:"statement_id,omitempty"`
	ReconciledAt *time.Time `json:"reconciled_at,omitempty"`
	Match        bool       `json:"match"`
	Differences  int        `json:"differences"`
}

// ReadDay reads the close of date; nil when no shard of it has waited for its payouts yet.
func ReadDay(ctx context.Context, q stepwisetype.DBTX, date time.Time) (*Day, error) {
	d := &Day{Date: date.Format(time.DateOnly)}
	var id *string
	var match *bool
	var diffs *int
	err := q.QueryRow(ctx, `SELECT shards, (SELECT count(*)::int FROM settlement_day_shard s WHERE s.settle_date = d.settle_date),
		overdue_at, closed_at, statement_id, reconciled_at, statement_match, differences
		FROM settlement_day d WHERE settle_date = $1`, date).
		Scan(&d.Shards, &d.AtRest, &d.OverdueAt, &d.ClosedAt, &id, &d.ReconciledAt, &match, &diffs)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the close of %s: %w", d.Date, err)
	}
	if id != nil {
		d.StatementID = *id
	}
	d.Match = match != nil && *match
	if diffs != nil {
		d.Differences = *diffs
	}
	return d, nil
}
