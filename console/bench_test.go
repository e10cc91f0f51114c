package console_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

// seedLedger fills a database the way a year of a busy settlement service would, in bulk
// (generate_series): n operations (1% refunds, 0.1% FAILED_PERMANENT, 0.01% MANUAL and
// UNKNOWN_EXTERNAL, the newest 0.1% PENDING, the rest SUCCEEDED), all of them from the four
// runs of one slot (250,000 per run at 1M: the run filter's worst case), n/2 audit events,
// 10,000 older runs, and a few takeovers.
func seedLedger(n int) func(ctx context.Context, pool *pgxpool.Pool) error {
	return func(ctx context.Context, pool *pgxpool.Pool) error {
		for _, sql := range []string{
			`INSERT INTO stepwise_schedule (name, spec, zone, gap, misfire, overlap, shards, watermark)
				VALUES ('daily', '0 2 * * *', 'UTC', 'run_after', '{}', 'skip', 4, '2026-03-01')`,
			`INSERT INTO stepwise_schedule_slot (schedule, slot, status, shards, version, materialized_at)
				SELECT 'daily', timestamptz '2026-03-01 00:00Z' - d * interval '1 day', 'materialized', 4, 1, now() FROM generate_series(0, 2499) d`,
			`INSERT INTO stepwise_checkpoint (key, fencing_token, steps)
				SELECT 'settle/' || to_char(timestamptz '2026-03-01 00:00Z' - (i / 4) * interval '1 day', 'YYYY-MM-DD') || '/' || (i % 4), 1, 10
				FROM generate_series(0, 9999) i`,
			`INSERT INTO stepwise_run (key, workflow, input, status, schedule, slot, shard, created_at)
				SELECT key, 'settle', '{}', CASE WHEN key LIKE 'settle/2026-03-01/%' THEN 'running' WHEN key LIKE '%/3' AND key LIKE '%-01/%' THEN 'failed' ELSE 'succeeded' END,
					'daily', to_date(split_part(key, '/', 2), 'YYYY-MM-DD')::timestamptz, split_part(key, '/', 3)::int,
					to_date(split_part(key, '/', 2), 'YYYY-MM-DD')::timestamptz
				FROM stepwise_checkpoint`,
			fmt.Sprintf(`INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, amount, currency, run_key,
					state, attempts, last_sent_at, next_check_at, unknown_since, manual_reason, created_at, updated_at, finished_at)
				SELECT gen_random_uuid(), CASE WHEN i %% 100 = 0 THEN 'refund' ELSE 'payout' END, 'bk-' || i, '{"account":"acct"}', '\x00',
					1000 + i %% 5000, 'EUR', 'settle/2026-03-01/' || (i %% 4), s.state, 1, t, 
					CASE WHEN s.state = 'UNKNOWN_EXTERNAL' THEN t END, CASE WHEN s.state = 'UNKNOWN_EXTERNAL' THEN t END,
					CASE WHEN s.state = 'MANUAL' THEN 'gave up: 5 checks' END, t, t, CASE WHEN s.state IN ('SUCCEEDED', 'FAILED_PERMANENT') THEN t END
				FROM generate_series(1, %[1]d) i,
					LATERAL (SELECT timestamptz '2026-03-01 00:00Z' - (%[1]d - i) * interval '30 ms' AS t) tt,
					LATERAL (SELECT CASE WHEN i %% 10000 = 1 THEN 'MANUAL' WHEN i %% 10000 = 2 THEN 'UNKNOWN_EXTERNAL'
						WHEN i %% 1000 = 3 THEN 'FAILED_PERMANENT' WHEN i > %[1]d - %[1]d / 1000 THEN 'PENDING' ELSE 'SUCCEEDED' END AS state) s`, n),
			fmt.Sprintf(`INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, attempt)
				SELECT 'op:' || gen_random_uuid(), 'op.transition', 'PROCESSING', 'SUCCEEDED', 'outbox', 1 FROM generate_series(1, %d)`, n/2),
			`INSERT INTO stepwise_event (subject, kind, actor, token) SELECT 'settle/2026-03-01/' || (i % 4), 'run.takeover', 'worker-2', i FROM generate_series(1, 20) i`,
			`VACUUM ANALYZE stepwise_operation`,
			`VACUUM ANALYZE stepwise_event`,
			`VACUUM ANALYZE stepwise_run`,
			`VACUUM ANALYZE stepwise_checkpoint`,
			`VACUUM ANALYZE stepwise_schedule_slot`,
		} {
			if _, err := pool.Exec(ctx, sql); err != nil {
				return fmt.Errorf("seeding: %w\n%s", err, sql)
			}
		}
		return nil
	}
}

// statementLog records the statements a page runs, to show their plans.
type statementLog struct {
	mu   sync.Mutex
	on   bool
	seen []tracedQuery
}

type tracedQuery struct {
	sql  string
	args []any
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	if l.on {
		l.seen = append(l.seen, tracedQuery{sql: d.SQL, args: d.Args})
	}
	l.mu.Unlock()
	return ctx
}

func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *statementLog) record(on bool) []tracedQuery {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on = on
	out := l.seen
	if on {
		l.seen = nil
	}
	return out
}

// ledgerConsole opens the console on a clone of a seeded template, with a statement log.
func ledgerConsole(b *testing.B, name string, n int) (http.Handler, *pgxpool.Pool, *statementLog) {
	b.Helper()
	dbURL := testkit.TemplateDBURL(b, name, seedLedger(n))
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(b, err)
	log := &statementLog{}
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	h, err := console.New(pool, &console.Config{Prefix: "/console", Logger: slog.New(slog.DiscardHandler),
		Authenticate: console.BasicAuth(testUser, testPassword)})
	require.NoError(b, err)
	return h, pool, log
}

// benchPages are the pages measured: each list with each filter, and the first and a later
// page (keyset), on the 1M ledger.
var benchPages = []string{
	"/console/",
	"/console/operations",
	"/console/operations?state=MANUAL",
	"/console/operations?state=FAILED_PERMANENT",
	"/console/operations?state=SUCCEEDED",
	"/console/operations?kind=refund",
	"/console/operations?kind=payout&state=PENDING",
	"/console/operations?run=" + url.QueryEscape("settle/2026-03-01/2"),
	"/console/operations?business_key=bk-777",
	"/console/runs",
	"/console/runs?status=failed",
	"/console/runs?schedule=daily",
	"/console/run?key=" + url.QueryEscape("settle/2026-03-01/1"),
	"/console/audit",
}

func serve(b *testing.B, h http.Handler, target string) string {
	r := httptest.NewRequest(http.MethodGet, "http://console.test"+target, nil)
	r.RemoteAddr = "127.0.0.1:1"
	r.SetBasicAuth(testUser, testPassword)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		b.Fatalf("GET %s: %d %s", target, w.Code, w.Body.String())
	}
	return w.Body.String()
}

// nextOf follows a page's Next link, so that a later page (keyset) is measured too.
func nextOf(body string) string {
	const marker = `id="next" href="`
	i := strings.Index(body, marker)
	if i < 0 {
		return ""
	}
	rest := body[i+len(marker):]
	return strings.ReplaceAll(rest[:strings.IndexByte(rest, '"')], "&amp;", "&")
}

// BenchmarkPagesOn1MOperations: every page answers in under 100 ms of server time with
// 1,000,000 operations in the ledger, and costs about what it costs on 1,000 (the baseline,
// measured in the same run): no page's cost grows with history. Reports ms/page on the
// large ledger and the ratio to the baseline; logs the plans of each page's statements.
// Skipped under -short (seeding takes about a minute the first time; the seeded template
// is kept for later runs).
func BenchmarkPagesOn1MOperations(b *testing.B) {
	if testing.Short() {
		b.Skip("seeds 1,000,000 operations; run without -short")
	}
	big, bigPool, log := ledgerConsole(b, "console_1m_v1", 1_000_000)
	small, _, _ := ledgerConsole(b, "console_1k_v1", 1_000)
	var n int
	require.NoError(b, bigPool.QueryRow(context.Background(), `SELECT count(*) FROM stepwise_operation`).Scan(&n))
	require.Equal(b, 1_000_000, n)

	pages := append([]string{}, benchPages...)
	// Second pages: the keyset cursor of the first page's Next link.
	for _, p := range []string{"/console/operations", "/console/operations?state=SUCCEEDED", "/console/operations?run=" + url.QueryEscape("settle/2026-03-01/2")} {
		if next := nextOf(serve(b, big, p)); next != "" {
			pages = append(pages, next+"#page2")
		}
	}
	for _, page := range pages {
		target, _, _ := strings.Cut(page, "#")
		b.Run(strings.TrimPrefix(page, "/console"), func(b *testing.B) {
			// Plans of the page's statements on the large ledger, once.
			log.record(true)
			serve(b, big, target)
			for _, q := range log.record(false) {
				if strings.HasPrefix(q.sql, "SELECT count(*) FROM stepwise_operation") {
					continue
				}
				rows, err := bigPool.Query(context.Background(), "EXPLAIN (ANALYZE, COSTS off, SUMMARY on) "+q.sql, q.args...)
				require.NoError(b, err)
				plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
				require.NoError(b, err)
				b.Logf("plan of %s:\n%s\n  %s", target, oneLine(q.sql), strings.Join(plan, "\n  "))
			}
			baseline := timePage(small, target, 5)
			var total time.Duration
			runs := 0
			for b.Loop() {
				start := time.Now()
				serve(b, big, target)
				total += time.Since(start)
				runs++
			}
			avg := total / time.Duration(runs)
			b.ReportMetric(float64(avg.Microseconds())/1000, "ms/page")
			b.ReportMetric(float64(avg)/float64(baseline), "x-vs-1k")
			b.Logf("%s: %.1f ms on 1M operations, %.1f ms on 1k (median of 5)", target, float64(avg.Microseconds())/1000, float64(baseline.Microseconds())/1000)
			if avg > 100*time.Millisecond {
				b.Errorf("%s: %s per page on 1M operations, want < 100ms", target, avg)
			}
		})
	}
}

func timePage(h http.Handler, target string, n int) time.Duration {
	var ds []time.Duration
	for range n {
		r := httptest.NewRequest(http.MethodGet, "http://console.test"+target, nil)
		r.RemoteAddr = "127.0.0.1:1"
		r.SetBasicAuth(testUser, testPassword)
		start := time.Now()
		h.ServeHTTP(httptest.NewRecorder(), r)
		ds = append(ds, time.Since(start))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[n/2]
}

func oneLine(sql string) string {
	s := strings.Join(strings.Fields(sql), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
