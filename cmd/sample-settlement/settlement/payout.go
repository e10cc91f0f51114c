package settlement

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// Settlement statuses, as stored in settlement.status.
const (
	StatusPending      = "PENDING"
	StatusPayoutSent   = "PAYOUT_SENT"
	StatusPaid         = "PAID"
	StatusPayoutFailed = "PAYOUT_FAILED"
	StatusNeedsReview  = "NEEDS_REVIEW"
)

// StatusFor is the settlement status that goes with its payout's ledger state. A payout the
// bank confirms at the first attempt goes PENDING → PAID in one transaction; PAYOUT_SENT is
// the time in between that is visible: sent, outcome not proven (UNKNOWN_EXTERNAL).
func StatusFor(state outbox.State) string {
	switch state {
	case outbox.StateSucceeded:
		return StatusPaid
	case outbox.StateFailedPermanent:
		return StatusPayoutFailed
	case outbox.StateUnknownExternal, outbox.StateProcessing:
		return StatusPayoutSent
	case outbox.StateManual:
		return StatusNeedsReview
	default: // PENDING, RETRYABLE: definitely not executed (yet)
		return StatusPending
	}
}

// outcomeSQL moves settlements with their payouts, set-based: one statement per batch of
// recorded outcomes, in the transaction that records them, so a settlement is PAID exactly
// when its payout is SUCCEEDED. A declined payout also posts the reversing ledger pair: the
// money is owed to the merchant again. A settlement already PAID or PAYOUT_FAILED is never
// moved (those payout states are terminal), so a count below the batch's is a bug, reported.
const outcomeSQL = `
WITH v AS (
	SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[]) AS v(id, status, ref)
), u AS (
	UPDATE settlement s SET status = v.status, external_ref = coalesce(v.ref, s.external_ref), updated_at = now()
	FROM v
	WHERE s.id = v.id AND s.status NOT IN ('PAID', 'PAYOUT_FAILED')
	RETURNING s.id, s.status
), rev AS (
	INSERT INTO ledger_entry (settlement_id, entry, account, currency, amount)
	SELECT e.settlement_id, 'reverse', e.account, e.currency, -e.amount
	FROM ledger_entry e JOIN u ON u.id = e.settlement_id
	WHERE u.status = 'PAYOUT_FAILED' AND e.entry = 'settle'
	ON CONFLICT DO NOTHING
)
SELECT count(*) FROM u`

// OnPayoutOutcomes is the payout kind's outcome callback (stepwise.KindConfig.OnOutcomeBatch):
// it moves each payout's settlement to the status that goes with the payout's new state.
func OnPayoutOutcomes(ctx context.Context, tx pgx.Tx, batch []outbox.OperationOutcome) error {
	ids := make([]int64, 0, len(batch))
	statuses := make([]string, 0, len(batch))
	refs := make([]*string, 0, len(batch))
	for _, oo := range batch {
		var p PayoutPayload
		if err := json.Unmarshal(oo.Op.Payload, &p); err != nil || p.SettlementID == 0 {
			return fmt.Errorf("payout %s (%s) names no settlement in its payload %s", oo.Op.ID, oo.Op.BusinessKey, oo.Op.Payload)
		}
		ids = append(ids, p.SettlementID)
		statuses = append(statuses, StatusFor(oo.Op.State))
		var ref *string
		if oo.Op.ExternalRef != "" {
			r := oo.Op.ExternalRef
			ref = &r
		}
		refs = append(refs, ref)
	}
	var moved int
	if err := tx.QueryRow(ctx, outcomeSQL, ids, statuses, refs).Scan(&moved); err != nil {
		return fmt.Errorf("moving %d settlements with their payouts: %w", len(ids), err)
	}
	if moved != len(ids) {
		return fmt.Errorf("moving %d settlements with their payouts: only %d were found not yet final; "+
			"a payout outcome arrived for a settlement that is missing or already PAID/PAYOUT_FAILED", len(ids), moved)
	}
	return nil
}

// RegisterPayoutKind records the payout kind in the database, as ApplySchema does and the
// Service does when it starts, for code that settles (and so enqueues payouts) where neither
// has run yet: outbox.Enqueue refuses a kind no outbox registered, since nothing would ever
// send it.
func RegisterPayoutKind(ctx context.Context, db stepwisetype.DBTX) error {
	return outbox.RegisterKinds(ctx, db, "settlement", PayoutKind)
}
