package settlement

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// BatchNotStarted is the batch status of a date none of whose runs exist.
const BatchNotStarted schedule.BatchStatus = "NOT_STARTED"

// Amount is a count of items and their sum in minor units.
type Amount struct {
	Count int64 `json:"count"`
	Sum   int64 `json:"sum"`
}

func (a *Amount) add(n int64) { a.Count++; a.Sum += n }

// CurrencyTotals compares one currency of a date across every place its money is recorded.
type CurrencyTotals struct {
	Currency string `json:"currency"`
	// Transactions are the date's card transactions.
	Transactions Amount `json:"transactions"`
	// Settled are the date's settlements, whatever their status.
	Settled Amount `json:"settled"`
	// SettledTransactions is how many transactions the settlements cover.
	SettledTransactions int64 `json:"settled_transactions"`
	// Paid are the payouts the ledger holds as SUCCEEDED.
	Paid Amount `json:"paid"`
	// Declined are the payouts the ledger holds as FAILED_PERMANENT.
	Declined Amount `json:"declined"`
	// Open are the payouts not yet proven either way (PENDING ... UNKNOWN_EXTERNAL, MANUAL).
	Open Amount `json:"open"`
	// Bank are the succeeded payments of the date on the bank's statement.
	Bank Amount `json:"bank"`
	// Match is true when Paid equals Bank and the settlements cover the transactions exactly
	// (same sum, same count).
	Match bool `json:"match"`
}

// Covered reports whether the settlements cover the transactions exactly: same sum, same
// number of transactions.
func (t *CurrencyTotals) Covered() bool {
	return t.Settled.Sum == t.Transactions.Sum && t.SettledTransactions == t.Transactions.Count
}

// Difference is one payout on which the ledger and the bank's statement disagree.
type Difference struct {
	Reference string `json:"reference"`
	// Kind is "missing at bank" (SUCCEEDED here, not on the statement), "missing here" (on
	// the statement, not SUCCEEDED here), "amount differs" or "other key" (paid under an
	// idempotency key that is not the operation's id).
	Kind     string `json:"kind"`
	State    string `json:"state,omitempty"`
	Currency string `json:"currency"`
	Local    int64  `json:"local"`
	Bank     int64  `json:"bank"`
}

// Report is a date's settlement as evidence shows it.
type Report struct {
	Date   string    `json:"date"`
	Slot   time.Time `json:"slot"`
	Shards int       `json:"shards"`

	// Batch is derived from the runs and the operations they enqueued
	// (schedule.DeriveBatchStatus), never from a loop that returned.
	Batch schedule.BatchStatus `json:"batch"`
	// Runs counts the date's runs by status (schedule.RunMissing for shards without one).
	Runs map[string]int `json:"runs"`
	// Operations counts the date's payouts by ledger state.
	Operations map[string]int `json:"operations"`
	// Settlements counts the date's settlements by status.
	Settlements map[string]int `json:"settlements"`
	// OldestUnknown is how long the date's longest-waiting UNKNOWN_EXTERNAL payout has
	// waited, or 0.
	OldestUnknown time.Duration `json:"oldest_unknown"`

	// Totals compares the money per currency.
	Totals []CurrencyTotals `json:"totals"`
	// Differences lists the payouts the ledger and the statement disagree on.
	Differences []Difference `json:"differences"`
	// DuplicatePayouts counts idempotency keys the bank applied more than once plus
	// references it paid under more than one key. Always 0 unless something is broken.
	DuplicatePayouts int `json:"duplicate_payouts"`
	// BankError is set when the bank could not be asked; the bank columns are then empty.
	BankError string `json:"bank_error,omitempty"`

	// Day is the date's close and reconciliation (close.go); nil before a shard of it
	// waited for its payouts.
	Day *Day `json:"day,omitempty"`
}

// TotalsMatch reports whether every currency matches and no payout differs.
func (r *Report) TotalsMatch() bool {
	if r.BankError != "" || len(r.Differences) > 0 {
		return false
	}
	for _, t := range r.Totals {
		if !t.Match {
			return false
		}
	}
	return true
}

// payoutRow is one of the date's payouts, from the ledger.
type payoutRow struct {
	id       string
	key      string
	state    string
	amount   int64
	currency string
}

// datePayoutsSQL reads the date's payouts: those its runs (runKeys) wrote, through the
// run_key index, so that a report or an invariant check reads the date asked for and not
// the whole ledger's history. Their business keys are PayoutKey's "<date>/<merchant>/…" or,
// on dates before dated ids, LegacyPayoutKey's "<merchant>/<date>/…": the date is either part.
// oldestUnknownSQL is the age of the date's oldest UNKNOWN_EXTERNAL payout, by run key.
const oldestUnknownSQL = `SELECT extract(epoch FROM now() - min(unknown_since))::float8 FROM stepwise_operation
		WHERE run_key = ANY($3) AND kind = $1 AND state = 'UNKNOWN_EXTERNAL' AND $2 IN (split_part(business_key, '/', 1), split_part(business_key, '/', 2))`

const datePayoutsSQL = `SELECT operation_id::text, business_key, state, coalesce(amount, 0), coalesce(currency, '')
		FROM stepwise_operation WHERE run_key = ANY($3) AND kind = $1 AND $2 IN (split_part(business_key, '/', 1), split_part(business_key, '/', 2))`

// datePayouts reads the date's payouts from the operation ledger; see datePayoutsSQL.
func datePayouts(ctx context.Context, q stepwisetype.DBTX, date time.Time, runKeys []string) ([]payoutRow, error) {
	rows, err := q.Query(ctx, datePayoutsSQL, PayoutKind, date.Format(time.DateOnly), runKeys)
	if err != nil {
		return nil, fmt.Errorf("reading payouts of %s: %w", date.Format(time.DateOnly), err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (payoutRow, error) {
		var p payoutRow
		return p, r.Scan(&p.id, &p.key, &p.state, &p.amount, &p.currency)
	})
	if err != nil {
		return nil, fmt.Errorf("reading payouts of %s: %w", date.Format(time.DateOnly), err)
	}
	return out, nil
}

// datePaymentsAt returns the bank's succeeded payments of the date (by reference).
func datePaymentsAt(payments []BankPayment, date time.Time) []BankPayment {
	var out []BankPayment
	for _, p := range payments {
		if referenceOfDate(p.Reference, date.Format(time.DateOnly)) {
			out = append(out, p)
		}
	}
	return out
}

// dateRuns is the compiled plan, date's slot and its run keys: what a report and the
// invariant check of one date start from.
func (p Plan) dateRuns(date time.Time) (Plan, time.Time, []string, error) {
	p, err := p.compiled()
	if err != nil {
		return Plan{}, time.Time{}, nil, err
	}
	slot, err := p.Slot(date)
	if err != nil {
		return Plan{}, time.Time{}, nil, err
	}
	keys, err := p.RunKeys(date)
	if err != nil {
		return Plan{}, time.Time{}, nil, err
	}
	return p, slot, keys, nil
}

// BuildReport gathers the report of date. bank may be nil: the bank's side is then left out
// and BankError says so.
func BuildReport(ctx context.Context, pool *pgxpool.Pool, bank Bank, plan Plan, date time.Time) (*Report, error) {
	plan, slot, keys, err := plan.dateRuns(date)
	if err != nil {
		return nil, err
	}
	r := &Report{
		Date: date.Format(time.DateOnly), Slot: slot, Shards: plan.Shards,
		Runs: map[string]int{}, Operations: map[string]int{}, Settlements: map[string]int{},
	}

	// Batch status by evidence: the runs of the date's slot, and what they enqueued.
	rows, err := pool.Query(ctx, `SELECT status, count(*)::int FROM stepwise_run WHERE key = ANY($1) GROUP BY status`, keys)
	if err != nil {
		return nil, fmt.Errorf("counting runs of %s: %w", r.Date, err)
	}
	present := 0
	if err := forEach(rows, func(status string, n int) { r.Runs[status] = n; present += n }); err != nil {
		return nil, fmt.Errorf("counting runs of %s: %w", r.Date, err)
	}
	runOps := map[outbox.State]int{}
	rows, err = pool.Query(ctx, `SELECT state, count(*)::int FROM stepwise_operation WHERE run_key = ANY($1) GROUP BY state`, keys)
	if err != nil {
		return nil, fmt.Errorf("counting operations of the runs of %s: %w", r.Date, err)
	}
	if err := forEach(rows, func(state string, n int) { runOps[outbox.State(state)] = n }); err != nil {
		return nil, fmt.Errorf("counting operations of the runs of %s: %w", r.Date, err)
	}
	switch {
	case present == 0:
		r.Batch = BatchNotStarted
	default:
		if present < plan.Shards {
			r.Runs[schedule.RunMissing] = plan.Shards - present
		}
		decision := schedule.SlotMaterialized
		operator, err := stepwise.NewOperatorClient(pool)
		if err != nil {
			return nil, err
		}
		if s, err := operator.SlotGet(ctx, ScheduleName, slot); err == nil {
			decision = s.Decision
		} else if !errors.Is(err, stepwisetype.ErrNotFound) {
			return nil, err
		}
		r.Batch = schedule.DeriveBatchStatus(decision, plan.Shards, r.Runs, runOps)
	}

	if r.Day, err = ReadDay(ctx, pool, date); err != nil {
		return nil, err
	}

	rows, err = pool.Query(ctx, `SELECT status, count(*)::int FROM settlement WHERE settle_date = $1 GROUP BY status`, date)
	if err != nil {
		return nil, fmt.Errorf("counting settlements of %s: %w", r.Date, err)
	}
	if err := forEach(rows, func(status string, n int) { r.Settlements[status] = n }); err != nil {
		return nil, fmt.Errorf("counting settlements of %s: %w", r.Date, err)
	}

	var oldest *float64
	if err := pool.QueryRow(ctx, oldestUnknownSQL, PayoutKind, r.Date, keys).Scan(&oldest); err != nil {
		return nil, fmt.Errorf("reading the oldest unknown payout of %s: %w", r.Date, err)
	}
	if oldest != nil {
		r.OldestUnknown = time.Duration(*oldest * float64(time.Second)).Round(time.Millisecond)
	}

	totals := map[string]*CurrencyTotals{}
	total := func(cur string) *CurrencyTotals {
		if t, ok := totals[cur]; ok {
			return t
		}
		t := &CurrencyTotals{Currency: cur}
		totals[cur] = t
		return t
	}
	rows, err = pool.Query(ctx, `
		SELECT 't', currency, count(*), sum(amount)::bigint, 0::bigint FROM card_txn WHERE business_date = $1 GROUP BY currency
		UNION ALL
		SELECT 's', currency, count(*), sum(amount)::bigint, sum(txn_count)::bigint FROM settlement WHERE settle_date = $1 GROUP BY currency`, date)
	if err != nil {
		return nil, fmt.Errorf("summing %s: %w", r.Date, err)
	}
	var which, cur string
	var n, sum, covered int64
	if _, err := pgx.ForEachRow(rows, []any{&which, &cur, &n, &sum, &covered}, func() error {
		t := total(cur)
		if which == "s" {
			t.Settled, t.SettledTransactions = Amount{Count: n, Sum: sum}, covered
		} else {
			t.Transactions = Amount{Count: n, Sum: sum}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("summing %s: %w", r.Date, err)
	}

	payouts, err := datePayouts(ctx, pool, date, keys)
	if err != nil {
		return nil, err
	}
	local := make(map[string]payoutRow, len(payouts))
	for _, p := range payouts {
		local[p.key] = p
		r.Operations[p.state]++
		t := total(p.currency)
		switch outbox.State(p.state) {
		case outbox.StateSucceeded:
			t.Paid.add(p.amount)
		case outbox.StateFailedPermanent:
			t.Declined.add(p.amount)
		default:
			t.Open.add(p.amount)
		}
	}

	if bank == nil {
		r.BankError = "no bank given"
	} else if err := r.compareWithBank(ctx, bank, date, local, total); err != nil {
		r.BankError = err.Error()
	}
	for _, t := range totals {
		t.Match = t.Covered() && t.Paid == t.Bank && r.BankError == ""
		r.Totals = append(r.Totals, *t)
	}
	sort.Slice(r.Totals, func(i, j int) bool { return r.Totals[i].Currency < r.Totals[j].Currency })
	sort.Slice(r.Differences, func(i, j int) bool { return r.Differences[i].Reference < r.Differences[j].Reference })
	return r, nil
}

// compareWithBank reads the bank's statement and ledger and compares them with the local
// payouts, payout by payout.
func (r *Report) compareWithBank(ctx context.Context, bank Bank, date time.Time, local map[string]payoutRow, total func(string) *CurrencyTotals) error {
	stmt, err := bank.Statement(ctx, time.Time{}, time.Time{})
	if err != nil {
		return fmt.Errorf("reading the bank's statement: %w", err)
	}
	seen := map[string]bool{}
	for _, p := range datePaymentsAt(stmt, date) {
		total(p.Currency).Bank.add(p.Amount)
		seen[p.Reference] = true
		l, ok := local[p.Reference]
		switch {
		case !ok || l.state != string(outbox.StateSucceeded):
			state := "none"
			if ok {
				state = l.state
			}
			r.Differences = append(r.Differences, Difference{Reference: p.Reference, Kind: "missing here", State: state,
				Currency: p.Currency, Local: l.amount, Bank: p.Amount})
		case l.amount != p.Amount || l.currency != p.Currency:
			r.Differences = append(r.Differences, Difference{Reference: p.Reference, Kind: "amount differs", State: l.state,
				Currency: p.Currency, Local: l.amount, Bank: p.Amount})
		case l.id != p.OperationID:
			r.Differences = append(r.Differences, Difference{Reference: p.Reference, Kind: "other key", State: l.state,
				Currency: p.Currency, Local: l.amount, Bank: p.Amount})
		}
	}
	for key, l := range local {
		if l.state == string(outbox.StateSucceeded) && !seen[key] {
			r.Differences = append(r.Differences, Difference{Reference: key, Kind: "missing at bank", State: l.state,
				Currency: l.currency, Local: l.amount})
		}
	}
	// A second payment under one id, or one reference paid under two ids, shows only in a
	// ledger of everything the bank applied: a test bank's (BankAudit). A real bank's
	// statement shows neither, and the report then counts none.
	a, ok := bank.(BankAudit)
	if !ok {
		return nil
	}
	ledger, err := a.Ledger(ctx)
	if err != nil {
		return fmt.Errorf("reading the bank's ledger: %w", err)
	}
	effects := map[string]int{}
	for _, p := range datePaymentsAt(ledger.Payments, date) {
		effects[p.OperationID]++
	}
	for _, n := range effects {
		if n > 1 {
			r.DuplicatePayouts += n - 1
		}
	}
	for ref, keys := range ledger.DuplicateReferences {
		if referenceOfDate(ref, date.Format(time.DateOnly)) {
			r.DuplicatePayouts += len(keys) - 1
		}
	}
	return nil
}

func forEach(rows pgx.Rows, f func(string, int)) error {
	var k string
	var n int
	_, err := pgx.ForEachRow(rows, []any{&k, &n}, func() error { f(k, n); return nil })
	return err
}
