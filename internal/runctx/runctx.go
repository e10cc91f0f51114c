// Package runctx carries the key of the workflow run whose step is executing in a context, so
// that outbox.Enqueue inside a step can tie its operations to the run without the caller
// repeating the key (a forgotten key let a batch look complete while its payouts were still
// PENDING). Package workflow sets it around every step; package outbox reads it.
package runctx

import "context"

type key struct{}

// With returns ctx carrying runKey as the key of the run whose step runs in it.
func With(ctx context.Context, runKey string) context.Context {
	return context.WithValue(ctx, key{}, runKey)
}

// From returns the key of the run whose step runs in ctx, and false outside a step.
func From(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(key{}).(string)
	return k, ok && k != ""
}
