package jitter

import (
	"testing"
	"time"
)

func TestBounds(t *testing.T) {
	for range 1000 {
		if d := Spread(time.Second, 0.25); d < 750*time.Millisecond || d >= 1250*time.Millisecond {
			t.Fatalf("Spread(1s, 0.25) = %v, want [750ms, 1250ms)", d)
		}
		if d := UpTo(time.Second); d < 0 || d >= time.Second {
			t.Fatalf("UpTo(1s) = %v, want [0, 1s)", d)
		}
	}
	if d := UpTo(0); d != 0 {
		t.Fatalf("UpTo(0) = %v, want 0", d)
	}
}
