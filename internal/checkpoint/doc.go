// Package checkpoint keeps, per key, a lease, a fencing token and a durable cursor in
// Postgres (table stepwise_checkpoint). It is the liveness half of Stepwise's step protocol
// and knows nothing of workflows or River. The step engine (internal/workflow) is its one
// caller; the public package checkpoint documents the protocol and holds ErrFenced.
//
// # The protocol
//
//  1. Claim takes the key only when its lease is free or expired, adds one to its fencing
//     token and sets lease_until from the database's clock. It runs under a short
//     lock_timeout, so a claim never queues behind a frozen holder.
//  2. Begin opens the step transaction, arming idle_in_transaction_session_timeout in the
//     same round trip, and checks (without locking) that the token is still current.
//  3. The caller writes its business rows in that transaction; Advance then stores the new
//     cursor WHERE fencing_token = ours. Zero rows means ErrFenced: roll back, stop.
//     AdvanceCommit sends that write and the COMMIT together, for a step that writes
//     nothing after it: there the write raises (stepwise_fenced, migration 017) instead of
//     matching no row, so that the server skips the COMMIT behind it.
//  4. Heartbeat renews the lease from the claim until the attempt ends, on a connection of
//     the store's own outside the pool, so a busy pool never makes a live owner look dead
//     (one more connection per process while leases are held); Release gives it up.
//
// # Failures it guards against
//
//   - A worker paused past its lease (GC, SIGSTOP, VM freeze) that wakes and commits:
//     the fenced write refuses it, so its rows never land.
//   - A worker frozen inside its transaction, holding locks on uncommitted rows: the server
//     kills that transaction after StallTimeout, so the next owner is not blocked.
//   - Clock skew between workers: every lease time is the database's now().
//   - A live, connected owner taken over because its pool was busy: renewals do not queue
//     behind the pool's step transactions.
//
// The row is deliberately not locked at the start of a step: measured here, a SIGSTOPped
// worker holding that lock blocks every claim until it wakes, and then finishes as if
// nothing happened.
//
//	store, _ := checkpoint.New(pool, &checkpoint.Config{Lease: 30 * time.Second})
//	lease, err := store.Claim(ctx, "settle/2026-11-29/3", owner, attempt)
//	tx, err := store.Begin(ctx, lease)
//	// ... business writes in tx ...
//	err = store.Advance(ctx, tx, lease, cursorJSON, nil) // ErrFenced: roll back
//	err = tx.Commit(ctx)
package checkpoint
