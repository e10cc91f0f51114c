package settlement

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// Check is one invariant of docs/design.md, checked for one date, with the evidence either way.
// Invariant 0 is the summary of Stepwise's own checkers over the date's runs, operations and slot.
type Check struct {
	Invariant int    `json:"invariant"`
	Name      string `json:"name"`
	OK        bool   `json:"ok"`
	Evidence  string `json:"evidence"`
}

// Result is the outcome of CheckInvariants.
type Result struct {
	Date   string  `json:"date"`
	Checks []Check `json:"checks"`
}

// OK reports whether every check held.
func (r *Result) OK() bool {
	for _, c := range r.Checks {
		if !c.OK {
			return false
		}
	}
	return true
}

// Err returns nil when every check held, else an error matching ErrInvariant that names the
// failed ones.
func (r *Result) Err() error {
	var failed []string
	for _, c := range r.Checks {
		if !c.OK {
			failed = append(failed, fmt.Sprintf("%d (%s)", c.Invariant, c.Name))
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("%w for %s: %s", ErrInvariant, r.Date, strings.Join(failed, "; "))
}

// closedDateAtRest names the check that a closed date has every payout proven (Check.Name).
const closedDateAtRest = "a closed date has every payout SUCCEEDED or FAILED_PERMANENT"

// SendDiscipline names the request-log check (Check.Name).
const SendDiscipline = "send discipline at the bank: one request in flight per payout, none after terminal, resend only after grace"

// maxEvidence bounds the offending keys listed in a check's evidence.
const maxEvidence = 5

func listSome(items []string) string {
	sort.Strings(items)
	if len(items) > maxEvidence {
		return strings.Join(items[:maxEvidence], ", ") + fmt.Sprintf(" and %d more", len(items)-maxEvidence)
	}
	return strings.Join(items, ", ")
}

// InvariantOpts are options of CheckInvariantsOpts.
type InvariantOpts struct {
	// Grace is the reconciler's grace period the service ran with (ServiceConfig.
	// ReconcileGrace), for judging not-found decisions against the bank's request log.
	// Defaults to the service's default, 1m.
	Grace time.Duration
}

// CheckInvariants checks docs/design.md's invariants 1 to 6 for date against the database and
// the bank, and returns each with its evidence. It expects the date to have come to rest
// (runs finished, payouts proven or MANUAL): run it after the settlement, not during. An
// error means a check could not run; failed invariants are in the Result (see Result.Err).
// It is CheckInvariantsOpts with the default options.
func CheckInvariants(ctx context.Context, pool *pgxpool.Pool, bank Bank, plan Plan, date time.Time) (*Result, error) {
	return CheckInvariantsOpts(ctx, pool, bank, plan, date, nil)
}

// CheckInvariantsOpts is CheckInvariants with options. Besides invariants 1-6 it checks the
// send discipline against the bank's request log (invariant 3): no two requests for one payout
// in flight at once, none after the ledger recorded it terminal, not-found believed only after
// the previous request ended plus the grace, every effect one payout's with its amount.
func CheckInvariantsOpts(ctx context.Context, pool *pgxpool.Pool, bank Bank, plan Plan, date time.Time, opts *InvariantOpts) (*Result, error) {
	grace := time.Minute
	if opts != nil && opts.Grace > 0 {
		grace = opts.Grace
	}
	plan, slot, keys, err := plan.dateRuns(date)
	if err != nil {
		return nil, err
	}
	res := &Result{Date: date.Format(time.DateOnly)}
	add := func(inv int, name string, ok bool, format string, args ...any) {
		res.Checks = append(res.Checks, Check{Invariant: inv, Name: name, OK: ok, Evidence: fmt.Sprintf(format, args...)})
	}
	payouts, err := datePayouts(ctx, pool, date, keys)
	if err != nil {
		return nil, err
	}

	// 1a. One run per (schedule, slot, shard).
	var runs, shardsCovered, extra int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE key = ANY($3)), count(DISTINCT shard) FILTER (WHERE key = ANY($3)),
			count(*) FILTER (WHERE NOT key = ANY($3))
		FROM stepwise_run WHERE schedule = $1 AND slot = $2`, ScheduleName, slot, keys).Scan(&runs, &shardsCovered, &extra); err != nil {
		return nil, fmt.Errorf("checking invariant 1: %w", err)
	}
	add(1, "one run per (schedule, slot, shard)", runs == plan.Shards && shardsCovered == plan.Shards && extra == 0,
		"slot %s: %d runs for %d shards (%d distinct), %d runs under other keys", slot.Format(time.RFC3339), runs, plan.Shards, shardsCovered, extra)

	// 1b. One operation per operation id and per business key; one payout per settlement.
	var settlements, withPayout, payoutsNoSettlement int
	if err := pool.QueryRow(ctx, invariant1bSQL, PayoutKind, date, keys).Scan(&settlements, &withPayout, &payoutsNoSettlement); err != nil {
		return nil, fmt.Errorf("checking invariant 1: %w", err)
	}
	ids, bkeys := map[string]int{}, map[string]int{}
	for _, p := range payouts {
		ids[p.id]++
		bkeys[p.key]++
	}
	var dupKeys []string
	for k, n := range bkeys {
		if n > 1 {
			dupKeys = append(dupKeys, k)
		}
	}
	ok := len(ids) == len(payouts) && len(dupKeys) == 0 && len(payouts) == settlements && withPayout == settlements && payoutsNoSettlement == 0
	add(1, "one operation per operation_id and business key", ok,
		"%d payouts, %d distinct ids, %d business keys used twice%s; %d settlements, %d with a payout, %d payouts without a settlement",
		len(payouts), len(ids), len(dupKeys), suffix(dupKeys), settlements, withPayout, payoutsNoSettlement)

	// 2. Fencing tokens strictly increase per run; each run finished under its newest token.
	var claims, backwards, staleFinish int
	var offenders []string
	rows, err := pool.Query(ctx, `
		WITH c AS (SELECT subject, id, token, lag(token) OVER (PARTITION BY subject ORDER BY id) AS prev
			FROM stepwise_event WHERE kind = 'lease.claim' AND subject = ANY($1))
		SELECT 'claim', subject, token, prev FROM c WHERE prev IS NOT NULL AND token <= prev
		UNION ALL
		SELECT 'finish', f.subject, f.token, (SELECT max(token) FROM stepwise_event c WHERE c.subject = f.subject AND c.kind = 'lease.claim' AND c.id < f.id)
		FROM stepwise_event f WHERE f.kind = 'run.finish' AND f.subject = ANY($1) AND f.token IS NOT NULL
			AND f.token < (SELECT max(token) FROM stepwise_event c WHERE c.subject = f.subject AND c.kind = 'lease.claim' AND c.id < f.id)`, keys)
	if err != nil {
		return nil, fmt.Errorf("checking invariant 2: %w", err)
	}
	var what, subject string
	var tok, prev int64
	if _, err := pgx.ForEachRow(rows, []any{&what, &subject, &tok, &prev}, func() error {
		if what == "claim" {
			backwards++
		} else {
			staleFinish++
		}
		offenders = append(offenders, fmt.Sprintf("%s %s token %d after %d", subject, what, tok, prev))
		return nil
	}); err != nil {
		return nil, fmt.Errorf("checking invariant 2: %w", err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event WHERE kind = 'lease.claim' AND subject = ANY($1)`, keys).Scan(&claims); err != nil {
		return nil, fmt.Errorf("checking invariant 2: %w", err)
	}
	add(2, "fencing tokens per run strictly increase", backwards == 0 && staleFinish == 0,
		"%d claims over %d runs; %d tokens not above the previous, %d runs finished under an older token%s",
		claims, runs, backwards, staleFinish, suffix(offenders))

	// 3. One bank effect per operation id; no reference paid under two keys.
	// Both need what only a test bank tells (BankAudit): every payment it applied, and every
	// request it received. Against a bank without them these checks fail, saying so: a check
	// that cannot run must not read as passed.
	var ledger *BankLedger
	bankAudit, bankErr := audit(bank)
	if bankErr == nil {
		ledger, bankErr = bankAudit.Ledger(ctx)
	}
	localByID := map[string]payoutRow{}
	for _, p := range payouts {
		localByID[p.id] = p
	}
	if bankErr != nil {
		add(3, "one external effect per operation_id", false, "cannot ask the bank: %v", bankErr)
	} else {
		applied := datePaymentsAt(ledger.Payments, date)
		effects := map[string]int{}
		var twice, strangers, dupRefs []string
		for _, p := range applied {
			effects[p.OperationID]++
			if effects[p.OperationID] == 2 {
				twice = append(twice, p.OperationID)
			}
			if l, ok := localByID[p.OperationID]; !ok || l.key != p.Reference {
				strangers = append(strangers, p.Reference+" under "+p.OperationID)
			}
		}
		for ref, ks := range ledger.DuplicateReferences {
			if referenceOfDate(ref, res.Date) {
				dupRefs = append(dupRefs, fmt.Sprintf("%s under %d keys", ref, len(ks)))
			}
		}
		add(3, "one external effect per operation_id", len(twice) == 0 && len(strangers) == 0 && len(dupRefs) == 0,
			"the bank applied %d payments of the date under %d keys; %d keys applied twice%s, %d references paid under two keys%s, %d payments not matching a payout%s",
			len(applied), len(effects), len(twice), suffix(twice), len(dupRefs), suffix(dupRefs), len(strangers), suffix(strangers))
	}

	// 3b. The send discipline, against what reached the bank (its request log): a bank that
	// deduplicates hides a second send, its log does not.
	if bankAudit == nil {
		_, err := audit(bank)
		add(3, SendDiscipline, false, "cannot ask the bank: %v", err)
	} else if reqs, err := bankAudit.Requests(ctx); err != nil {
		add(3, SendDiscipline, false, "cannot read the bank's request log: %v", err)
	} else {
		var mine []workflowtest.Request
		for _, r := range reqs {
			if _, ok := localByID[r.OperationID]; ok || referenceOfDate(r.Reference, res.Date) {
				mine = append(mine, r.Request)
			}
		}
		vs, err := workflowtest.CheckInvariants(ctx, pool, &workflowtest.CheckOpts{Requests: mine, Grace: grace, Runs: keys})
		if err != nil {
			return nil, fmt.Errorf("checking invariant 3 (request log): %w", err)
		}
		var ev []string
		for _, v := range vs {
			if v.Invariant == 3 {
				ev = append(ev, v.Name+": "+v.Evidence)
			}
		}
		add(3, SendDiscipline, len(ev) == 0, "%d requests for the date's payouts reached the bank (grace %s); %d violations%s",
			len(mine), grace, len(ev), suffix(ev))
	}

	// 4. Every payout ends SUCCEEDED, FAILED_PERMANENT or MANUAL; none PROCESSING without a
	// live lease.
	byState := map[string]int{}
	var open []string
	for _, p := range payouts {
		byState[p.state]++
		s := outbox.State(p.state)
		if !s.Terminal() && s != outbox.StateManual {
			open = append(open, p.key+" "+p.state)
		}
	}
	var lapsed int
	if err := pool.QueryRow(ctx, invariant4LapsedSQL, PayoutKind, res.Date, keys).Scan(&lapsed); err != nil {
		return nil, fmt.Errorf("checking invariant 4: %w", err)
	}
	add(4, "every operation ends SUCCEEDED, FAILED_PERMANENT or MANUAL", len(open) == 0 && lapsed == 0,
		"payouts by state %s; %d not at rest%s, %d PROCESSING with a lapsed lease", fmtCounts(byState), len(open), suffix(open), lapsed)

	// 4b. A closed date (close.go) has every payout SUCCEEDED or FAILED_PERMANENT: closing
	// states that nothing about the date's money is still open.
	day, err := ReadDay(ctx, pool, date)
	if err != nil {
		return nil, fmt.Errorf("checking invariant 4: %w", err)
	}
	var unproven []string
	for _, p := range payouts {
		if s := outbox.State(p.state); s != outbox.StateSucceeded && s != outbox.StateFailedPermanent {
			unproven = append(unproven, p.key+" "+p.state)
		}
	}
	if day == nil || day.ClosedAt == nil {
		add(4, closedDateAtRest, true, "the date is not closed")
	} else {
		add(4, closedDateAtRest, len(unproven) == 0, "closed at %s; %d payouts neither SUCCEEDED nor FAILED_PERMANENT%s",
			day.ClosedAt.UTC().Format(time.RFC3339), len(unproven), suffix(unproven))
	}

	// 5. The date's slot ended completed, failed or skipped — visibly, never silently.
	rep, err := BuildReport(ctx, pool, nil, plan, date)
	if err != nil {
		return nil, fmt.Errorf("checking invariant 5: %w", err)
	}
	switch rep.Batch {
	case schedule.BatchCompleted, schedule.BatchSkipped, schedule.BatchFailed, schedule.BatchCancelled, schedule.BatchNeedsAttention:
		add(5, "every due slot ends completed, failed or recorded as skipped", true,
			"slot %s is %s (runs %s, their operations %s)", slot.Format(time.RFC3339), rep.Batch, fmtCounts(rep.Runs), fmtCounts(rep.Operations))
	default:
		add(5, "every due slot ends completed, failed or recorded as skipped", false,
			"slot %s is %s (runs %s, their operations %s): not at rest", slot.Format(time.RFC3339), rep.Batch, fmtCounts(rep.Runs), fmtCounts(rep.Operations))
	}

	// 6. Money balances.
	if err := checkMoney(ctx, pool, bank, plan, date, keys, add); err != nil {
		return nil, err
	}

	// Stepwise's own checkers, the ones that hold at every instant, over the date's runs,
	// their operations, slot and events (and any duplicate of them under another key),
	// through indexes: a check of one date costs that date, not the whole history.
	vs, err := workflowtest.CheckInvariants(ctx, pool, &workflowtest.CheckOpts{Runs: keys})
	if err != nil {
		return nil, err
	}
	if len(vs) == 0 {
		add(0, "Stepwise's checkers, the date's runs (workflowtest.CheckInvariants)", true,
			"no violation of invariants 1, 2 and 5 in the date's runs, operations or slot")
	}
	for _, v := range vs {
		add(v.Invariant, v.Name+" (Stepwise's checkers)", false, "%s", v.Evidence)
	}
	return res, nil
}

// invariant1bSQL counts the date's settlements, those with a payout and the payouts without
// a settlement. The payouts are read by the date's run keys (an index), not by a function of
// the business key (which no index serves: a scan of every payout ever made).
const invariant1bSQL = `
		WITH p AS (SELECT (payload->>'settlement_id')::bigint AS sid FROM stepwise_operation
			WHERE run_key = ANY($3) AND kind = $1 AND $2::date::text IN (split_part(business_key, '/', 1), split_part(business_key, '/', 2)))
		SELECT (SELECT count(*) FROM settlement WHERE settle_date = $2),
			(SELECT count(DISTINCT s.id) FROM settlement s JOIN p ON p.sid = s.id WHERE s.settle_date = $2),
			(SELECT count(*) FROM p WHERE NOT EXISTS (SELECT 1 FROM settlement s WHERE s.id = p.sid))`

// invariant4LapsedSQL counts the date's payouts PROCESSING under a lapsed lease, by run key.
const invariant4LapsedSQL = `SELECT count(*) FROM stepwise_operation WHERE run_key = ANY($3) AND kind = $1 AND state = 'PROCESSING'
		AND lease_until < now() AND $2 IN (split_part(business_key, '/', 1), split_part(business_key, '/', 2))`

// checkMoney checks invariant 6: transactions = settlements per currency; the ledger entries
// balance and each settlement has exactly its own; settlement statuses agree with their
// payouts; paid settlements = SUCCEEDED payouts = the bank's statement.
func checkMoney(ctx context.Context, pool *pgxpool.Pool, bank Bank, plan Plan, date time.Time, keys []string, add func(int, string, bool, string, ...any)) error {
	const name = "money balances: transactions = settlements = ledger = bank statement"
	rep, err := BuildReport(ctx, pool, bank, plan, date)
	if err != nil {
		return fmt.Errorf("checking invariant 6: %w", err)
	}
	var parts []string
	ok := rep.BankError == ""
	if !ok {
		parts = append(parts, "cannot ask the bank: "+rep.BankError)
	}
	for _, t := range rep.Totals {
		mark := "="
		if !t.Covered() || t.Paid != t.Bank {
			mark, ok = "≠", false
		}
		parts = append(parts, fmt.Sprintf("%s: %d transactions %s, settled %d of them in %d settlements %s, paid %d %s %s bank %d %s",
			t.Currency, t.Transactions.Count, FormatMoney(t.Transactions.Sum, t.Currency),
			t.SettledTransactions, t.Settled.Count, FormatMoney(t.Settled.Sum, t.Currency),
			t.Paid.Count, FormatMoney(t.Paid.Sum, t.Currency), mark, t.Bank.Count, FormatMoney(t.Bank.Sum, t.Currency)))
	}
	if len(rep.Differences) > 0 {
		ok = false
		var ds []string
		for _, d := range rep.Differences {
			ds = append(ds, d.Reference+": "+d.Kind)
		}
		parts = append(parts, fmt.Sprintf("%d payouts differ%s", len(ds), suffix(ds)))
	}

	// Double entry: every currency sums to zero; each settlement has its two settle entries,
	// and the reversing pair exactly when its payout was declined.
	var unbalanced []string
	rows, err := pool.Query(ctx, `SELECT e.currency, sum(e.amount)::bigint FROM ledger_entry e JOIN settlement s ON s.id = e.settlement_id
		WHERE s.settle_date = $1 GROUP BY e.currency HAVING sum(e.amount) <> 0`, date)
	if err != nil {
		return fmt.Errorf("checking invariant 6: %w", err)
	}
	var cur string
	var sum int64
	if _, err := pgx.ForEachRow(rows, []any{&cur, &sum}, func() error {
		unbalanced = append(unbalanced, fmt.Sprintf("%s off by %d", cur, sum))
		return nil
	}); err != nil {
		return fmt.Errorf("checking invariant 6: %w", err)
	}
	var entries, badEntries, badStatus int
	if err := pool.QueryRow(ctx, `
		WITH e AS (
			SELECT s.id, s.status, s.amount,
				count(e.id) FILTER (WHERE e.entry = 'settle') AS settle_n,
				coalesce(sum(e.amount) FILTER (WHERE e.entry = 'settle' AND e.amount > 0), 0) AS debit,
				count(e.id) FILTER (WHERE e.entry = 'reverse') AS reverse_n,
				count(e.id) AS n
			FROM settlement s LEFT JOIN ledger_entry e ON e.settlement_id = s.id
			WHERE s.settle_date = $1 GROUP BY s.id
		)
		SELECT coalesce(sum(n), 0)::int,
			count(*) FILTER (WHERE settle_n <> 2 OR debit <> amount OR reverse_n <> CASE WHEN status = 'PAYOUT_FAILED' THEN 2 ELSE 0 END)::int,
			(SELECT count(*) FROM settlement s JOIN stepwise_operation o
				ON o.kind = $2 AND o.run_key = ANY($3) AND (o.payload->>'settlement_id')::bigint = s.id
			 WHERE s.settle_date = $1 AND s.status <> CASE o.state
				WHEN 'SUCCEEDED' THEN 'PAID' WHEN 'FAILED_PERMANENT' THEN 'PAYOUT_FAILED' WHEN 'MANUAL' THEN 'NEEDS_REVIEW'
				WHEN 'UNKNOWN_EXTERNAL' THEN 'PAYOUT_SENT' WHEN 'PROCESSING' THEN s.status ELSE 'PENDING' END)::int
		FROM e`, date, PayoutKind, keys).Scan(&entries, &badEntries, &badStatus); err != nil {
		return fmt.Errorf("checking invariant 6: %w", err)
	}
	if len(unbalanced) > 0 || badEntries > 0 || badStatus > 0 {
		ok = false
	}
	parts = append(parts, fmt.Sprintf("%d ledger entries, unbalanced currencies: %d%s, settlements with wrong entries: %d, settlement status disagreeing with its payout: %d",
		entries, len(unbalanced), suffix(unbalanced), badEntries, badStatus))
	add(6, name, ok, "%s", strings.Join(parts, "\n"))
	return nil
}

func suffix(items []string) string {
	if len(items) == 0 {
		return ""
	}
	return " (" + listSome(items) + ")"
}

// fmtCounts renders counts as "A=1 B=2", sorted by key.
func fmtCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}

// minorDigits are the currencies whose minor unit is not a hundredth.
var minorDigits = map[string]int{"JPY": 0, "KRW": 0, "BHD": 3, "KWD": 3}

// FormatMoney renders minor units as a decimal amount with its currency: "1234.56 EUR".
func FormatMoney(minor int64, currency string) string {
	digits, ok := minorDigits[currency]
	if !ok {
		digits = 2
	}
	sign := ""
	if minor < 0 {
		sign, minor = "-", -minor
	}
	if digits == 0 {
		return fmt.Sprintf("%s%s %s", sign, group(minor), currency)
	}
	div := int64(1)
	for range digits {
		div *= 10
	}
	return fmt.Sprintf("%s%s.%0*d %s", sign, group(minor/div), digits, minor%div, currency)
}

// group writes n with thousands separators.
func group(n int64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
