package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

// BenchmarkDeliver measures delivery throughput, claim to recorded outcome with audit events,
// against a zero-latency fake bank over real HTTP on loopback. The target is at least 5,000
// operations/s on a 2-core machine: delivery must keep pace with the settlement steps that
// enqueue the operations (~14,000 items/s), not cap it the way one River job per operation
// does (~1,000/s).
//
//	go test ./outbox -run '^$' -bench Deliver -benchtime 20000x
func BenchmarkDeliver(b *testing.B) {
	for _, bc := range []struct{ batch, concurrency int }{{200, 16}, {500, 32}} {
		b.Run(fmt.Sprintf("batch=%d/concurrency=%d", bc.batch, bc.concurrency), func(b *testing.B) {
			ctx := context.Background()
			pool := testkit.DB(b)
			_, client := startBank(b, nil, 5*time.Second, true)
			ob := newOutbox(b, pool, bankSender{Client: client}, func(kc *outbox.KindConfig) {
				kc.BatchSize, kc.Concurrency = bc.batch, bc.concurrency
			})
			ops := make([]outbox.EnqueueParams, 0, 1000)
			for i := range b.N {
				ops = append(ops, payout(fmt.Sprintf("bench/m-%d", i), "acct", int64(i+1)))
				if len(ops) == cap(ops) || i == b.N-1 {
					enqueue(b, pool, ops...)
					ops = ops[:0]
				}
			}
			b.ResetTimer()
			start := time.Now()
			n, err := ob.Drain(ctx, "payout")
			elapsed := time.Since(start)
			b.StopTimer()
			require.NoError(b, err)
			require.Equal(b, b.N, n)
			b.ReportMetric(float64(n)/elapsed.Seconds(), "ops/s")
		})
	}
}
