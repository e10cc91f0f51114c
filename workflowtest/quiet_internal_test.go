package workflowtest

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A backlog that drains slower than QuietTimeout but steadily is not a hang when Progress
// is given; a drain that stands still is, after QuietTimeout of standing still.
func TestWaitQuietFollowsProgress(t *testing.T) {
	t.Parallel()
	drain := func(stallAt int64) (until func(context.Context) (bool, error), progress func(context.Context) (int64, error)) {
		var done atomic.Int64
		began := time.Now()
		progress = func(context.Context) (int64, error) {
			n := min(int64(time.Since(began)/(20*time.Millisecond)), stallAt)
			done.Store(n)
			return n, nil
		}
		until = func(ctx context.Context) (bool, error) {
			n, _ := progress(ctx)
			return n >= 50, nil // about a second of steady work
		}
		return until, progress
	}

	until, _ := drain(1 << 62)
	c := &ChaosConfig{Until: until, QuietTimeout: 300 * time.Millisecond}
	quiet, err := c.waitQuiet(context.Background())
	if quiet || err == nil {
		t.Fatalf("without Progress the 300ms bound holds: quiet %v, err %v", quiet, err)
	}

	until, progress := drain(1 << 62)
	c = &ChaosConfig{Until: until, Progress: progress, QuietTimeout: 300 * time.Millisecond, QuietMax: 10 * time.Second}
	began := time.Now()
	if quiet, err := c.waitQuiet(context.Background()); !quiet {
		t.Fatalf("a steady drain of ~1s was cut off: %v", err)
	}
	t.Logf("steady drain reached quiet after %s", time.Since(began).Round(time.Millisecond))

	until, progress = drain(10) // stands still after ~200ms
	c = &ChaosConfig{Until: until, Progress: progress, QuietTimeout: 300 * time.Millisecond, QuietMax: 10 * time.Second}
	began = time.Now()
	quiet, err = c.waitQuiet(context.Background())
	if quiet || err == nil || !strings.Contains(err.Error(), "no progress for 300ms") {
		t.Fatalf("a stalled drain must fail on no progress: quiet %v, err %v", quiet, err)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("a stalled drain was waited for %s, want about 500ms", took)
	}
	t.Logf("stalled drain: %v", err)
}
