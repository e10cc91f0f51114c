// Package checkpoint is the fenced cursor every run commits with each step: per run key, a
// lease, a fencing token and the cursor, in the table stepwise_checkpoint. The engine keeps it
// for you (stepwise.Client); this package documents the protocol and holds the one error a
// caller can meet, ErrFenced. The store itself is internal (internal/checkpoint), so that the
// lease protocol can change without breaking your code: nothing outside the engine called it.
//
// # The protocol (docs/design.md, "The step protocol", gives each step in full)
//
//  1. Claim: a worker takes the run's key only when its lease is free or lapsed, adds one to
//     its fencing token and sets lease_until from the database's clock, under a short
//     lock_timeout so that a claim never queues behind a frozen holder.
//  2. Begin: the step's transaction opens with idle_in_transaction_session_timeout armed in
//     the same round trip.
//  3. The step writes its business rows in that transaction; the fenced write then stores the
//     new cursor WHERE fencing_token = the worker's. Zero rows is ErrFenced: the transaction
//     rolls back and the worker stops, so none of its rows land.
//  4. Heartbeat: the lease is renewed from the claim until the attempt ends, on a connection
//     of its own outside the pool, so a busy pool never makes a live owner look dead.
//
// # Failures it guards against
//
//   - A worker paused past its lease (GC, SIGSTOP, VM freeze) that wakes and commits: the
//     fenced write refuses it.
//   - A worker frozen inside its transaction, holding locks on uncommitted rows: the server
//     kills that transaction after the stall timeout, so the next owner is not blocked.
//   - Clock skew between workers: every lease time is the database's now().
//   - A live, connected owner taken over because its pool was busy: renewals do not queue
//     behind the pool's step transactions.
package checkpoint
