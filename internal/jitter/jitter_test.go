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
	for try, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 5 * time.Second, 50: 5 * time.Second} {
		if d := Doubling(time.Second, 5*time.Second, try); d < want*3/4 || d >= want*5/4 {
			t.Fatalf("Doubling(1s, 5s, %d) = %v, want %v ±25%%", try, d, want)
		}
	}
	if d := UpTo(0); d != 0 {
		t.Fatalf("UpTo(0) = %v, want 0", d)
	}
}
