// Package outbox is the operation ledger's machinery: Enqueue, the Outbox that delivers each
// kind through River, the transitions, the waker and the reads. Its users are the public
// package outbox (which shows only what a program calls), the stepwise.Client that runs the
// Outbox, and the reconciler and console, which move operations with MoveTx and MoveOneTx and
// read rows with Columns and ScanOperation. The protocol is documented in the public package
// and in docs/design.md.
package outbox
