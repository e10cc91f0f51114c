package outbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/pgtx"
)

// heldClaim is what a dispatcher knows, on its own clock, about a claim it holds: the claim
// number (the fence its outcome is recorded under) and until when the claim is certainly
// still its own. validUntil carries Go's monotonic reading, taken before the statement that
// took or renewed the lease, so it errs early: a paused process, a wall clock stepped back or
// a slow round trip can only make it drop a claim it still had, never send on one it lost.
type heldClaim struct {
	claim      int
	validUntil time.Time
}

// claimBook is the set of claims one Outbox holds of one kind. Senders consult it right
// before Send; the claim statement and the lease renewals extend it.
type claimBook struct {
	mu   sync.Mutex
	held map[uuid.UUID]heldClaim
}

func newClaimBook() *claimBook {
	return &claimBook{held: map[uuid.UUID]heldClaim{}}
}

// take records claims taken by a statement that began at before.
func (b *claimBook) take(ops []*Operation, before time.Time, lease time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, op := range ops {
		b.held[op.ID] = heldClaim{claim: op.Claims, validUntil: before.Add(lease)}
	}
}

// extend records that the leases of the claims (id, claim) were renewed by a statement that
// began at before. A claim the book no longer holds, or holds under another number, is left
// alone: its outcome was recorded, or it is somebody else's claim now.
func (b *claimBook) extend(ids []uuid.UUID, claims []int, before time.Time, lease time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, id := range ids {
		if h, ok := b.held[id]; ok && h.claim == claims[i] {
			h.validUntil = before.Add(lease)
			b.held[id] = h
		}
	}
}

// left is how long the claim of op is certainly still ours (0 or less when it may not be).
func (b *claimBook) left(op *Operation) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	h, ok := b.held[op.ID]
	if !ok || h.claim != op.Claims {
		return 0
	}
	return time.Until(h.validUntil)
}

// release forgets the claim of op once its outcome is on the way to the ledger.
func (b *claimBook) release(op *Operation) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h, ok := b.held[op.ID]; ok && h.claim == op.Claims {
		delete(b.held, op.ID)
	}
}

// renewLeaseSQL extends the lease of claims this dispatcher still holds. It never revives a
// lease that already ran out (crash recovery may be about to, or did, hand the operation to
// the reconciler), and never extends past the kind's hold limit counted from the claim.
const renewLeaseSQL = `
UPDATE stepwise_operation SET lease_until = now() + $3::interval
WHERE kind = $1 AND state = 'PROCESSING' AND leased_by = $2
	AND lease_until > now()
	AND lease_until < now() + $4::interval
	AND claimed_at > now() - $5::interval
	AND ($6::uuid IS NULL OR (operation_id = $6 AND claims = $7))
RETURNING operation_id, claims`

// renew runs renewLeaseSQL (for every claim of kind held by this Outbox whose lease is older
// than fresh, or for the one claim of op) and records the renewals in the book.
func (o *Outbox) renew(ctx context.Context, ks *kindState, fresh time.Duration, op *Operation) error {
	var id *uuid.UUID
	claim := 0
	if op != nil {
		id, claim = &op.ID, op.Claims
	}
	lease := ks.cfg.Lease
	before := time.Now()
	rows, err := o.db.Query(ctx, renewLeaseSQL, ks.name, o.actor, lease, lease-fresh, ks.cfg.holdLimit(), id, claim)
	if err != nil {
		return err
	}
	var ids []uuid.UUID
	var claims []int
	var rid uuid.UUID
	var rc int
	_, err = pgx.ForEachRow(rows, []any{pgtx.UUIDDest(&rid), &rc}, func() error {
		ids, claims = append(ids, rid), append(claims, rc)
		return nil
	})
	if err != nil {
		return err
	}
	ks.book.extend(ids, claims, before, lease)
	return nil
}

// errClaimLost is why a claimed operation was not sent: its claim could not be proven to last
// the send's timeout.
var errClaimLost = errors.New("not sent: the claim could not be proven to outlast the send timeout (the dispatcher was paused or cut off from the database, or the operation moved on)")

// claimHolds reports whether op's claim is certainly ours for at least the send timeout, on
// the local monotonic clock, renewing its lease once if it is too short. Without it a
// dispatcher paused (GC, SIGSTOP, a frozen VM) or cut off from the database after claiming
// would wake and send operations that crash recovery, the reconciler or a person had since
// moved on — resent, or even recorded FAILED_PERMANENT.
func (o *Outbox) claimHolds(ctx context.Context, ks *kindState, op *Operation) bool {
	need := ks.cfg.Timeout
	if ks.book.left(op) >= need {
		return true
	}
	rctx, cancel := context.WithTimeout(ctx, max(ks.book.left(op), 0)+time.Second)
	defer cancel()
	if err := o.renew(rctx, ks, 0, op); err != nil {
		return false
	}
	return ks.book.left(op) >= need
}
