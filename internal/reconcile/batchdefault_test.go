package reconcile

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// An unset BatchSize follows Concurrency: a pass claims, looks up and records one batch before
// it claims the next, so a batch of 100 kept a pass at 100 lookups in flight however high
// Concurrency was set (the bench's bigday section: Concurrency 256 at a 100ms bank, 355
// lookups/s with batches of 100, 550 with 1,024).
func TestBatchSizeDefaultFollowsConcurrency(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		concurrency, batch, want int
	}{
		{0, 0, BatchSizeDefault},  // the defaults: 8 at once, batches of 100
		{16, 0, BatchSizeDefault}, // 4 × 16 = 64: still 100
		{64, 0, 256},              // 4 rounds of 64
		{256, 0, 1024},            // 4 rounds of 256
		{5000, 0, 10000},          // capped where the validation stops
		{256, 100, 100},           // an explicit BatchSize wins
	} {
		c := (&Config{Kinds: map[string]*KindConfig{"payout": {Concurrency: tc.concurrency, BatchSize: tc.batch}}}).WithDefaults()
		require.Equal(t, tc.want, c.Kinds["payout"].BatchSize, "Concurrency %d, BatchSize %d", tc.concurrency, tc.batch)
	}
}
