package console_test

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

// withoutConsoleIndexes turns migration 006's operation indexes back into main's: the state
// index dropped, the run index back to (run_key, state).
var withoutConsoleIndexes = []string{
	"DROP INDEX stepwise_operation_console_state_idx",
	"DROP INDEX stepwise_operation_console_run_idx",
	"CREATE INDEX stepwise_operation_run_key_idx ON stepwise_operation (run_key, state) WHERE run_key IS NOT NULL",
}

// BenchmarkConsoleIndexesWriteCost: what the console's operation indexes cost the write path.
// Two databases, one with migration 006's operation indexes and one without (the baseline, in
// the same run). Each round, on each in turn, enqueues 2,000 payouts in steps of 200 (as settle
// steps would) and delivers them through the real outbox (claim, instant send, outcome and
// audit row). synchronous_commit is off so that fsync latency, which the indexes do not
// change, does not drown what they do. Reports the median per-round ratio with/without for
// enqueueing and for delivering; logs every round.
func BenchmarkConsoleIndexesWriteCost(b *testing.B) {
	if testing.Short() {
		b.Skip("delivers thousands of payouts per round; run without -short")
	}
	const n, step = 2000, 200
	ctx := context.Background()
	type side struct {
		pool *pgxpool.Pool
		ob   *outbox.Outbox
	}
	open := func(withIndexes bool) side {
		cfg, err := pgxpool.ParseConfig(testkit.DBURL(b))
		require.NoError(b, err)
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(b, err)
		b.Cleanup(pool.Close)
		if !withIndexes {
			for _, sql := range withoutConsoleIndexes {
				_, err := pool.Exec(ctx, sql)
				require.NoError(b, err)
			}
		}
		ob, err := outbox.New(pool, &outbox.Config{ID: "bench", Logger: slog.New(slog.DiscardHandler), Kinds: map[string]*outbox.KindConfig{
			"payout": {BatchSize: step, Concurrency: 16, Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
				return outbox.Receipt{ExternalRef: "ok"}, nil
			})},
		}})
		require.NoError(b, err)
		return side{pool, ob}
	}
	without, with := open(false), open(true)
	offset := 0
	round := func(s side) (enq, del time.Duration) {
		start := time.Now()
		enqueueSteps(b, s.pool, offset, n, step)
		enq = time.Since(start)
		start = time.Now()
		delivered, err := s.ob.Drain(ctx, "payout")
		del = time.Since(start)
		require.NoError(b, err)
		require.Equal(b, n, delivered)
		return enq, del
	}
	var enqRatios, delRatios []float64
	for b.Loop() {
		e0, d0 := round(without)
		e1, d1 := round(with)
		offset += n
		enqRatios = append(enqRatios, float64(e1)/float64(e0))
		delRatios = append(delRatios, float64(d1)/float64(d0))
		b.Logf("round: enqueue %s with, %s without (%.2f×); deliver %s with, %s without (%.2f×)",
			e1.Round(time.Millisecond), e0.Round(time.Millisecond), enqRatios[len(enqRatios)-1],
			d1.Round(time.Millisecond), d0.Round(time.Millisecond), delRatios[len(delRatios)-1])
	}
	sort.Float64s(enqRatios)
	sort.Float64s(delRatios)
	b.ReportMetric(enqRatios[len(enqRatios)/2], "enqueue-with/without")
	b.ReportMetric(delRatios[len(delRatios)/2], "deliver-with/without")
}

// enqueueSteps writes payouts w-from … w-(from+n-1) in transactions of step, like settle steps.
func enqueueSteps(b *testing.B, pool *pgxpool.Pool, from, n, step int) {
	ctx := context.Background()
	for i := from; i < from+n; i += step {
		ops := make([]outbox.EnqueueParams, 0, step)
		for j := i; j < i+step && j < from+n; j++ {
			ops = append(ops, outbox.EnqueueParams{Kind: "payout", BusinessKey: fmt.Sprintf("w-%d", j), Payload: []byte(`{"account":"acct"}`),
				Amount: int64(100 + j), Currency: "EUR", RunKey: fmt.Sprintf("settle/2026-03-01/%d", j%4)})
		}
		require.NoError(b, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, ops...)
			return err
		}))
	}
}
