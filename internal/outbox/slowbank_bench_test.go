package outbox_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// BenchmarkDeliverSlowBank measures delivery against a bank answering in tens of
// milliseconds, over real HTTP on loopback, at the concurrencies where one process stops
// keeping its senders busy. Each of its rounds drains b.N operations. It reports the median
// rate as a share of the physical limit Concurrency / latency ("limit"), the statements,
// claims and recording transactions per operation, and the share of the wall time claims
// and recordings were waited for, from the last round; each round is logged with the
// machine's load. SLOWBANK_CONCURRENCY=256 runs one concurrency only.
//
//	go test ./outbox -run '^$' -bench DeliverSlowBank -benchtime 4000x -cpuprofile cpu.out
func BenchmarkDeliverSlowBank(b *testing.B) {
	const rounds = 3
	for _, bc := range []struct {
		latency     time.Duration
		concurrency int
	}{{50 * time.Millisecond, 256}, {50 * time.Millisecond, 1024}} {
		if only := os.Getenv("SLOWBANK_CONCURRENCY"); only != "" && only != fmt.Sprint(bc.concurrency) {
			continue
		}
		b.Run(fmt.Sprintf("latency=%s/concurrency=%d", bc.latency, bc.concurrency), func(b *testing.B) {
			ctx := context.Background()
			counts := &stmtCounter{}
			pool := tracedPool(b, counts)
			bank := fakebank.New(&fakebank.Config{Latency: bc.latency})
			require.NoError(b, bank.Start())
			b.Cleanup(func() { _ = bank.Close() })
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.MaxIdleConns, tr.MaxIdleConnsPerHost = bc.concurrency, bc.concurrency
			b.Cleanup(tr.CloseIdleConnections)
			client := fakebank.NewClient(bank.URL(), &http.Client{Timeout: 5 * time.Second, Transport: tr})
			ob := newOutbox(b, pool, bankSender{Client: client}, func(kc *outbox.KindConfig) {
				kc.Concurrency, kc.Timeout, kc.Lease = bc.concurrency, 5*time.Second, time.Minute
			})
			limit := float64(bc.concurrency) / bc.latency.Seconds()
			var rates []float64
			var last stmtCounts
			var lastElapsed time.Duration
			b.ResetTimer()
			for round := range rounds {
				b.StopTimer()
				ops := make([]outbox.EnqueueParams, 0, 1000)
				for i := range b.N {
					ops = append(ops, payout(fmt.Sprintf("slow/%d/m-%d", round, i), "acct", int64(i+1)))
					if len(ops) == cap(ops) || i == b.N-1 {
						enqueue(b, pool, ops...)
						ops = ops[:0]
					}
				}
				counts.reset()
				b.StartTimer()
				start := time.Now()
				n, err := ob.Drain(ctx, "payout")
				elapsed := time.Since(start)
				require.NoError(b, err)
				// A send refused under load (NotSent) is claimed again in the same drain.
				require.GreaterOrEqual(b, n, b.N)
				rate := float64(b.N) / elapsed.Seconds()
				last, lastElapsed = counts.reset(), elapsed
				rates = append(rates, rate)
				b.Logf("round %d: %6.0f ops/s (%.3f of %.0f/s), %.0f ops/tx, %.0f ops/claim, %.3f stmts/op, claim %.2f, record %.2f, load %s",
					round, rate, rate/limit, limit, float64(b.N)/float64(max(last.commits, 1)), float64(b.N)/float64(max(last.claims, 1)),
					float64(last.stmts)/float64(b.N), last.claimWait.Seconds()/elapsed.Seconds(), last.recordWait.Seconds()/elapsed.Seconds(), loadAvg())
			}
			b.StopTimer()
			n := float64(b.N)
			b.ReportMetric(median(rates), "ops/s")
			b.ReportMetric(median(rates)/limit, "limit")
			b.ReportMetric(float64(last.stmts)/n, "stmts/op")
			b.ReportMetric(n/float64(max(last.claims, 1)), "ops/claim")
			b.ReportMetric(n/float64(max(last.commits, 1)), "ops/tx")
			b.ReportMetric(last.claimWait.Seconds()/lastElapsed.Seconds(), "claim-busy")
			b.ReportMetric(last.recordWait.Seconds()/lastElapsed.Seconds(), "record-busy")
		})
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// loadAvg is the machine's 1-minute load average, for the log beside each rate.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// tracedPool is a pool of 8 on a fresh database, counting its statements into counts.
func tracedPool(b *testing.B, counts *stmtCounter) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(testkit.DBURL(b))
	require.NoError(b, err)
	cfg.MaxConns = 8
	cfg.ConnConfig.Tracer = counts
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	return pool
}

// stmtCounter counts a pool's statements: every one, the claims, the commits, and the time
// waited for claims and for recording statements (the transition and its transaction).
type stmtCounter struct {
	mu                    sync.Mutex
	stmts, claims, commit int
	claimWait, recordWait time.Duration
}

type stmtCounts struct {
	stmts, claims, commits int
	claimWait, recordWait  time.Duration
}

type stmtStart struct {
	sql string
	at  time.Time
}

type stmtKey struct{}

func (s *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, stmtKey{}, stmtStart{sql: d.SQL, at: time.Now()})
}

func (s *stmtCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	st, ok := ctx.Value(stmtKey{}).(stmtStart)
	if !ok {
		return
	}
	took := time.Since(st.at)
	sql := strings.TrimSpace(st.sql)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stmts++
	switch {
	case strings.HasPrefix(sql, "WITH c AS"):
		s.claims++
		s.claimWait += took
	case strings.EqualFold(sql, "commit"):
		s.commit++
		s.recordWait += took
	case strings.HasPrefix(sql, "WITH n AS"), strings.EqualFold(sql, "begin"):
		s.recordWait += took
	}
}

func (s *stmtCounter) reset() stmtCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := stmtCounts{stmts: s.stmts, claims: s.claims, commits: s.commit, claimWait: s.claimWait, recordWait: s.recordWait}
	s.stmts, s.claims, s.commit, s.claimWait, s.recordWait = 0, 0, 0, 0, 0
	return c
}
