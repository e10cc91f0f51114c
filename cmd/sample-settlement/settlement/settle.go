package settlement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/workflow"
)

// PayoutKind is the operation kind of payouts in the operation ledger.
const PayoutKind = "payout"

// BatchSizeDefault is how many merchants one settle step covers. Measured (docs/design.md,
// performance budget): 100 per statement reaches about 15,000 merchants/s on two cores,
// 1,000 about 20,400/s; 500 keeps each step's transaction short while staying close.
const BatchSizeDefault = 500

// Batch selects the merchants one SettleBatch call settles: of the next Size × Shards
// merchants by id after AfterMerchant (the walk), at most the first Size of shard Shard (of
// Shards).
type Batch struct {
	// Date is the business date settled (midnight UTC, as ParseDate returns).
	Date time.Time
	// Shard and Shards select the merchants with merchant_shard(hash, Shards) = Shard, which
	// is schedule.ShardOf(code, Shards).
	Shard, Shards int
	// AfterMerchant is the cursor: the last merchant id a previous batch walked past, 0 at
	// first. Every merchant of the shard up to it is settled.
	AfterMerchant int64
	// Size is the most merchants the batch covers. Defaults to BatchSizeDefault. A batch walks
	// Size × Shards merchant ids, about Size of them in its shard (at most 100,000 ids, or Size
	// where that is more: a batch of many shards then covers fewer than Size).
	Size int
	// RunKey is the workflow run settling the batch; it is stored on settlements and on the
	// payout operations, so a run's batch status can be proven from its operations.
	// Optional (a bench through plain pgx has no run).
	RunKey string
}

// BatchResult is what one SettleBatch call did.
type BatchResult struct {
	// LastMerchant is the next cursor: the last merchant id the batch walked past, settled or
	// of another shard. It equals AfterMerchant when there were no merchants after it.
	LastMerchant int64
	// Merchants is how many merchants the batch covered.
	Merchants int
	// Settlements is how many settlements it created, each with two ledger entries and a
	// payout. Fewer than the groups found means some existed already (a replay).
	Settlements int
	// Done is true when the shard has no merchants after LastMerchant (the walk reached the
	// end of the merchant table).
	Done bool
}

// maxWalk bounds the merchant ids one batch walks (Size × Shards), so that a run of many
// shards keeps its steps short; its batches then cover fewer than Size merchants. A Size
// above it is walked as Size.
const maxWalk = 100_000

// walkSize is how many merchant ids a batch of size of one of shards walks: size × shards,
// at most maxWalk, never less than size. No product is formed that could overflow: a walk
// that wrapped to 0 would never move the cursor (nor finish the shard), one that wrapped
// negative is an error from PostgreSQL.
func walkSize(size, shards int) int {
	if size >= maxWalk/shards {
		return max(size, maxWalk)
	}
	return size * shards
}

// settleSQL settles a batch of merchants in one statement: no round trip per merchant.
//
//   - walk: the next merchant ids after the cursor, at most $7 (walkSize), along the
//     primary key. Guards against: a plan that read and sorted every merchant after the
//     cursor. The LIMIT inside the walk is what keeps the key: told it needs the first $7
//     rows in id order, the planner walks the index for the first cursors' values (a
//     connection's first five executions are planned for them) and wherever the rows lie on
//     disk (the generic plan, from the sixth on, with a table stored out of id order after a
//     CLUSTER or years of updates). One exception, bounded: where the window is most of what
//     is left after the cursor (a shard's last step on a small table stored out of id
//     order), reading the table once and sorting is cheaper than that many random reads,
//     and the planner may do so. An unbounded walk filtered by shard afterwards cost the
//     planner a guess it could not make: that the filter keeps one merchant in Shards (it
//     assumes 0.5%). Measured at 20,000 merchants, the generic plan of the unbounded walk
//     read 15,000 merchant rows for a batch of 1,000 once the table was clustered by shard
//     (TestSettleBatchReadsOnlyItsBatch); at 40,000 merchants in id order, the custom plans
//     of a fence-less walk took 74-96 ms instead of 15-19.
//   - batch: the walk's merchants of the shard, at most Size ($4), in id order.
//   - sums: their transactions of the date, per (merchant, type, currency), read from
//     card_txn_settle_idx alone.
//   - ins: one settlement per group. ON CONFLICT on the business key DO NOTHING: a step that
//     is replayed after a crash, or a second run that somehow got the same merchants, finds
//     the settlement there and creates nothing, so nothing downstream happens twice.
//   - entries: two ledger entries per settlement just created (and only those, so a replay
//     posts nothing), debit merchant payable, credit bank clearing: they sum to zero.
//
// The last SELECT returns on every row the batch's size, the next cursor and how many ids
// were walked, and one row with NULL settlement columns when nothing was created, so the
// cursor moves even over merchants without transactions; and on every row the first business
// date of dated payouts (payout_scheme), read in the step's own transaction: no process holds
// a copy that could disagree with the database's. The next cursor is the batch's last
// merchant when the batch is full (the walk may hold more of the shard beyond it), else the
// walk's last id: every merchant of the shard up to it is in the batch.
const settleSQL = `
WITH walk AS MATERIALIZED (
	SELECT id, code, bank_account, shard_hash FROM merchant WHERE id > $1 ORDER BY id LIMIT $7
), batch AS MATERIALIZED (
	SELECT id, code, bank_account FROM walk
	WHERE merchant_shard(shard_hash, $2) = $3
	ORDER BY id
	LIMIT $4
), sums AS (
	SELECT t.merchant_id, t.type, t.currency, sum(t.amount)::bigint AS amount, count(*)::int AS n
	FROM batch b JOIN card_txn t ON t.merchant_id = b.id AND t.business_date = $5
	GROUP BY t.merchant_id, t.type, t.currency
), ins AS (
	INSERT INTO settlement (merchant_id, settle_date, type, currency, amount, txn_count, run_key)
	SELECT merchant_id, $5, type, currency, amount, n, $6 FROM sums
	ORDER BY merchant_id, type, currency
	ON CONFLICT (merchant_id, settle_date, type, currency) DO NOTHING
	RETURNING id, merchant_id, type, currency, amount
), entries AS (
	INSERT INTO ledger_entry (settlement_id, entry, account, currency, amount)
	SELECT i.id, 'settle', e.account, i.currency, e.sign * i.amount
	FROM ins i JOIN batch b ON b.id = i.merchant_id
	CROSS JOIN LATERAL (VALUES ('merchant_payable:' || b.code, 1), ('bank_clearing', -1)) AS e(account, sign)
)
SELECT s.n, CASE WHEN s.n = $4 THEN s.last ELSE w.last END, w.n, (SELECT dated_from FROM payout_scheme),
	i.id, b.code, b.bank_account, i.type, i.currency, i.amount
FROM (SELECT count(*)::int AS n, coalesce(max(id), $1) AS last FROM batch) s
CROSS JOIN (SELECT count(*)::int AS n, coalesce(max(id), $1) AS last FROM walk) w
LEFT JOIN (ins i JOIN batch b ON b.id = i.merchant_id) ON true
ORDER BY i.merchant_id, i.type, i.currency`

// PayoutPayload is what a payout operation carries besides its amount and currency.
type PayoutPayload struct {
	// SettlementID is the settlement the payout pays; the outcome callback moves it.
	SettlementID int64 `json:"settlement_id"`
	// Merchant is the merchant's code.
	Merchant string `json:"merchant"`
	// Account is the payee account at the bank.
	Account string `json:"account"`
}

// PayoutKey is the business key of a settlement's payout: "<date>/<merchant>/<type>/<currency>",
// e.g. "2026-03-01/M000042/pos/EUR". It is also the payment's reference at the bank. The date
// comes first so that a day's payouts sit together in the ledger's (kind, business_key) index,
// as their ids (PayoutID) do in the others: a ledger of years then costs a new day what a new
// ledger does (docs/design.md, *A long history*).
func PayoutKey(merchant string, date time.Time, typ, currency string) string {
	return date.Format(time.DateOnly) + "/" + merchant + "/" + typ + "/" + currency
}

// LegacyPayoutKey is the business key payouts had before dated ids,
// "<merchant>/<date>/<type>/<currency>", under OperationID's ids. Payouts of dates before
// payout_scheme's date keep it (schema.sql).
func LegacyPayoutKey(merchant string, date time.Time, typ, currency string) string {
	return merchant + "/" + date.Format(time.DateOnly) + "/" + typ + "/" + currency
}

// referenceOfDate reports whether a bank reference (a payout's business key, PayoutKey) is of
// the date, written YYYY-MM-DD. Keys made before the date came first (<merchant>/<date>/…)
// count too, here and in the SQL that reads a date's payouts, so that a ledger from before
// keeps its reports.
func referenceOfDate(reference, date string) bool {
	return strings.HasPrefix(reference, date+"/") || strings.Contains(reference, "/"+date+"/")
}

// PayoutID is the operation id of the payout with key businessKey, settling date: a dated id
// (outbox.DatedOperationID), the same on every run of the step that enqueues it.
func PayoutID(date time.Time, businessKey string) uuid.UUID {
	return outbox.DatedOperationID(date, PayoutKind, businessKey)
}

// SettleBatch settles one batch of merchants in tx: their settlements and ledger entries in
// one statement, then their payouts in the operation ledger (outbox.Enqueue, one statement),
// all committed with tx or not at all. It is the settle step's whole business logic, exported
// so the same code can be measured through plain pgx and through Stepwise.
func SettleBatch(ctx context.Context, tx pgx.Tx, b Batch) (BatchResult, error) {
	if b.Size == 0 {
		b.Size = BatchSizeDefault
	}
	res := BatchResult{LastMerchant: b.AfterMerchant}
	switch {
	case b.Shards < 1 || b.Shard < 0 || b.Shard >= b.Shards:
		return res, fmt.Errorf("settling: shard %d of %d: want 0 <= shard < shards", b.Shard, b.Shards)
	case b.Size < 1:
		return res, fmt.Errorf("settling: batch size %d: want at least 1", b.Size)
	case b.Date.IsZero():
		return res, errors.New("settling: Batch.Date is zero; set the business date")
	case !b.Date.Equal(b.Date.UTC().Truncate(24 * time.Hour)):
		// The date names the payouts (key, id, scheme): one instant, read one way.
		return res, fmt.Errorf("settling: Batch.Date %s is not a business date's midnight UTC; use ParseDate", b.Date)
	}
	b.Date = b.Date.UTC()
	var runKey *string
	if b.RunKey != "" {
		runKey = &b.RunKey
	}
	walk := walkSize(b.Size, b.Shards)
	rows, err := tx.Query(ctx, settleSQL, b.AfterMerchant, b.Shards, b.Shard, b.Size, b.Date, runKey, walk)
	if err != nil {
		return res, fmt.Errorf("settling merchants after %d (shard %d/%d): %w", b.AfterMerchant, b.Shard, b.Shards, err)
	}
	var ops []outbox.EnqueueParams
	walked := 0
	for rows.Next() {
		var (
			id                      *int64
			code, account, typ, cur *string
			amount                  *int64
			datedFrom               *time.Time
		)
		if err := rows.Scan(&res.Merchants, &res.LastMerchant, &walked, &datedFrom, &id, &code, &account, &typ, &cur, &amount); err != nil {
			rows.Close()
			return res, fmt.Errorf("settling merchants after %d: reading result: %w", b.AfterMerchant, err)
		}
		if datedFrom == nil {
			rows.Close()
			return res, errors.New("settling: table payout_scheme is empty: restore its one row (the first business date of dated payouts) from a backup; " +
				"migrating again would record a new date, and a date settled under one scheme would get payouts under the other")
		}
		if id == nil {
			continue
		}
		payload, err := json.Marshal(PayoutPayload{SettlementID: *id, Merchant: *code, Account: *account})
		if err != nil {
			rows.Close()
			return res, fmt.Errorf("encoding payout of settlement %d: %w", *id, err)
		}
		// A date keeps one scheme forever, whichever build settles it: a step re-run after a
		// failover must name each payout as the first attempt may have sent it.
		key, opID := PayoutKey(*code, b.Date, *typ, *cur), uuid.Nil
		if b.Date.Before(*datedFrom) {
			key = LegacyPayoutKey(*code, b.Date, *typ, *cur)
		} else {
			opID = PayoutID(b.Date, key)
		}
		ops = append(ops, outbox.EnqueueParams{
			ID:          opID,
			Kind:        PayoutKind,
			BusinessKey: key,
			Payload:     payload,
			Amount:      *amount,
			Currency:    *cur,
			RunKey:      b.RunKey,
		})
	}
	if err := rows.Err(); err != nil {
		return res, fmt.Errorf("settling merchants after %d (shard %d/%d): %w", b.AfterMerchant, b.Shard, b.Shards, err)
	}
	res.Settlements = len(ops)
	// A full batch may have more of the shard after it; a walk shorter than asked reached
	// the end of the table.
	res.Done = res.Merchants < b.Size && walked < walk
	if len(ops) > 0 {
		if _, err := outbox.Enqueue(ctx, tx, ops...); err != nil {
			return res, fmt.Errorf("enqueuing %d payouts: %w", len(ops), err)
		}
	}
	return res, nil
}

// SettleArgs is the input of one shard's settlement run of one date: the River job args.
type SettleArgs struct {
	Date   string `json:"date"`
	Shard  int    `json:"shard"`
	Shards int    `json:"shards"`
}

// Kind is the River job kind.
func (SettleArgs) Kind() string { return "settle_merchants" }

// SettleCursor is what survives a crash: the last merchant id walked past (every merchant
// of the shard up to it is settled).
type SettleCursor struct {
	AfterMerchant int64 `json:"after_merchant"`
}

// SettleWorker is the settle step function: one batch of merchants per step, each step's
// settlements, ledger entries, payouts and cursor committed together, fenced.
type SettleWorker struct {
	workflow.StepperDefaults[SettleArgs, SettleCursor]

	// BatchSize is the number of merchants per step. Defaults to BatchSizeDefault.
	BatchSize int

	// PayoutsAtRestTimeout, when positive, makes the run wait after its last batch for its
	// payouts to be at rest, then record its shard and, as the date's last shard, close the
	// date (close.go); each timeout marks the date overdue and waits again. 0: the run ends
	// with its last batch and dates are not closed (the lab's benchmarks measure settling
	// alone).
	PayoutsAtRestTimeout time.Duration
}

// Step settles the next batch of the run's shard.
func (w *SettleWorker) Step(ctx context.Context, s *workflow.Step[SettleArgs, SettleCursor]) (workflow.Next, error) {
	date, err := ParseDate(s.Args.Date)
	if err != nil {
		// No retry can fix the input of a run.
		return workflow.Fail(err), nil
	}
	if s.Woken() != nil {
		return closeShard(ctx, s, date, w.PayoutsAtRestTimeout)
	}
	res, err := SettleBatch(ctx, s.Tx, Batch{
		Date: date, Shard: s.Args.Shard, Shards: s.Args.Shards,
		AfterMerchant: s.Cursor.AfterMerchant, Size: w.BatchSize, RunKey: s.RunKey,
	})
	if err != nil {
		return workflow.Next{}, err
	}
	s.Cursor.AfterMerchant = res.LastMerchant
	s.ReportItems(res.Merchants) // on the step's trace span
	if res.Done {
		if w.PayoutsAtRestTimeout > 0 {
			return settleWait(w.PayoutsAtRestTimeout), nil
		}
		return workflow.Done(), nil
	}
	return workflow.Continue(), nil
}
