package runctx

import (
	"context"
	"testing"
)

func TestWithFrom(t *testing.T) {
	if k, ok := From(context.Background()); ok || k != "" {
		t.Fatalf("From(background) = %q, %v; want none", k, ok)
	}
	if k, ok := From(With(context.Background(), "settle/2026-03-01")); !ok || k != "settle/2026-03-01" {
		t.Fatalf("From(With(key)) = %q, %v", k, ok)
	}
	if _, ok := From(With(context.Background(), "")); ok {
		t.Fatal("an empty key counts as a run")
	}
}
