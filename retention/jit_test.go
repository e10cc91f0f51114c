package retention

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

// A batch must not be JIT-compiled. Its statements are a LIMIT over an index walk whose
// filter the planner cannot estimate (each event's operation state, read by a subplan), so on
// a long ledger their estimated cost passed PostgreSQL's jit_above_cost (100,000, with jit on
// by default) and every batch compiled its expressions with LLVM first: on the bench's ledger
// of 10M operations, 155 ms of compiling for a batch that executed in 22 ms (a batch of 500:
// 222-265 ms with jit on, 11 ms off), so pruning the operations' events went at about 650
// rows/s and 9M old events would have taken four hours.
// Here the server is told to compile everything (jit_above_cost 0), and auto_explain reports
// each statement's plan to the client: no statement of Prune may show a JIT section.
func TestPruneDoesNotJITCompile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seed := testkit.DB(t)
	url := seed.Config().ConnString()
	var jit bool
	require.NoError(t, seed.QueryRow(ctx, `SELECT pg_jit_available()`).Scan(&jit))
	if !jit {
		t.Skip("this server has no JIT provider: nothing to turn off")
	}
	seedSettledOperations(t, seed, 1200)

	pool, explained := explainedPool(t, url, `SET jit = on`, `SET jit_above_cost = 0`, `SET jit_inline_above_cost = 0`, `SET jit_optimize_above_cost = 0`)
	jitted := func() []string {
		var out []string
		for _, n := range explained() {
			if strings.Contains(n, "stepwise_") && strings.Contains(n, "JIT:") {
				out = append(out, n)
			}
		}
		return out
	}
	// The harness sees JIT where it happens: a statement outside Prune is compiled.
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM stepwise_event WHERE kind = 'op.transition'`).Scan(&n))
	require.Equal(t, 1200, n)
	require.NotEmpty(t, jitted(), "with jit_above_cost 0 every statement is compiled, and auto_explain says so")

	res, err := Prune(ctx, pool, &Config{OlderThan: 30 * 24 * time.Hour, BatchSize: 500, Pause: time.Millisecond})
	require.NoError(t, err)
	require.EqualValues(t, 1200, res.OperationEvents)
	require.Empty(t, jitted(), "Prune's statements must run without JIT")
}

// explainedPool is a pool on url whose sessions run sets and report the plan of every
// statement they execute to the client (auto_explain with ANALYZE); explained returns the
// plans reported since its last call. It skips t where auto_explain cannot be loaded (LOAD
// needs a superuser).
func explainedPool(t *testing.T, url string, sets ...string) (pool *pgxpool.Pool, explained func() []string) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	var (
		mu      sync.Mutex
		notices []string
	)
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		notices = append(notices, n.Message)
	}
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		for _, s := range append([]string{
			`LOAD 'auto_explain'`,
			`SET auto_explain.log_min_duration = 0`,
			`SET auto_explain.log_analyze = on`,
			`SET auto_explain.log_level = notice`,
		}, sets...) {
			if _, err := conn.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	}
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Skipf("auto_explain cannot be loaded per session here (it needs a superuser): %v", err)
	}
	return pool, func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := notices
		notices = nil
		return out
	}
}

// Each batch of a pass starts where the last one ended, not at the oldest event. The events a
// batch deleted stay in stepwise_event_at_idx as dead entries until VACUUM, and a batch that
// walked from the oldest stepped over every one of them: on the bench's ledger of 10M
// operations, with 2M events deleted, 24 of a batch's 29 ms. Here a pass deletes 1,500 events
// in batches of 500: every batch's walk must start at the latest event the batch before it
// deleted (an index condition, where the walk begins), later and later.
func TestPruneBatchesStartWhereTheLastEnded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seed := testkit.DB(t)
	url := seed.Config().ConnString()
	seedSettledOperations(t, seed, 1500)
	var oldest time.Time
	require.NoError(t, seed.QueryRow(ctx, `SELECT min(at) FROM stepwise_event`).Scan(&oldest))
	// Custom plans show the values a batch was given, in UTC whatever the server's zone.
	pool, explained := explainedPool(t, url, `SET plan_cache_mode = force_custom_plan`, `SET TimeZone = 'UTC'`)
	explained()
	res, err := Prune(ctx, pool, &Config{OlderThan: 30 * 24 * time.Hour, BatchSize: 500, Pause: time.Millisecond})
	require.NoError(t, err)
	require.EqualValues(t, 1500, res.OperationEvents)

	from := regexp.MustCompile(`Index Cond: \(\(at < .*\) AND \(at >= '([^']+)'::timestamp with time zone\)\)`)
	var starts []string
	for _, plan := range explained() {
		if !strings.Contains(plan, "DELETE FROM stepwise_event WHERE id IN") {
			continue
		}
		m := from.FindStringSubmatch(plan)
		require.NotNil(t, m, "a batch of operation events must walk stepwise_event_at_idx from a start:\n%s", plan)
		starts = append(starts, m[1])
	}
	// Three full batches and the one that found the rest empty.
	require.Len(t, starts, 4, "batches of operation events: %v", starts)
	at := func(s string) time.Time {
		v, err := time.Parse("2006-01-02 15:04:05-07", s)
		require.NoError(t, err, "start %q", s)
		return v
	}
	require.True(t, at(starts[0]).Before(oldest), "the first batch walks from before the oldest event: %s", starts[0])
	for i := 1; i < len(starts); i++ {
		// Batch i starts at the latest event batch i-1 deleted: the events are a minute
		// apart, 500 a batch.
		want := oldest.Add(time.Duration(500*i-1) * time.Minute)
		require.WithinDuration(t, want, at(starts[i]), time.Second, "batch %d starts at %s", i+1, starts[i])
	}
}

// seedSettledOperations writes n SUCCEEDED operations, finished a minute apart from 90 days
// ago, each with its op.transition event at that time: n events for Prune's second walk.
func seedSettledOperations(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		WITH ops AS (
			INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, state, created_at, updated_at, finished_at)
			SELECT gen_random_uuid(), 'payout', 'bk-' || i, '{}', '\x00', 'SUCCEEDED', t, t, t
			  FROM generate_series(1, $1::int) i, LATERAL (SELECT now() - interval '90 days' + i * interval '1 minute' AS t) tt
			RETURNING operation_id, finished_at)
		INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, at)
		SELECT 'op:' || operation_id, 'op.transition', 'PROCESSING', 'SUCCEEDED', 'outbox', finished_at FROM ops`, n)
	require.NoError(t, err)
}
