// Package reconcile is the reconciler's machinery: the Reconciler that settles
// UNKNOWN_EXTERNAL operations by asking the external system (run by stepwise.Client), a
// person's resolution (ResolveTx, behind the client's OperationResolve), and CompareTotals.
// The public package reconcile shows what a program implements and calls; the protocol is
// documented there and in docs/design.md.
package reconcile
