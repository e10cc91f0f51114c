package retention

import (
	"context"
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
// of 10M operations 155-265 ms of a batch of 500 events that took 11 ms to run, so pruning the
// operations' events went at about 600 rows/s and 9M old events would have taken four hours.
// Here the server is told to compile everything (jit_above_cost 0), and auto_explain reports
// each statement's plan to the client: no statement of Prune may show a JIT section.
func TestPruneDoesNotJITCompile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testkit.DBURL(t)
	seed, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(seed.Close)
	var jit bool
	require.NoError(t, seed.QueryRow(ctx, `SELECT pg_jit_available()`).Scan(&jit))
	if !jit {
		t.Skip("this server has no JIT provider: nothing to turn off")
	}
	_, err = seed.Exec(ctx, `
		WITH ops AS (
			INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, state, created_at, updated_at, finished_at)
			SELECT gen_random_uuid(), 'payout', 'bk-' || i, '{}', '\x00', 'SUCCEEDED', t, t, t
			  FROM generate_series(1, 1200) i, LATERAL (SELECT now() - interval '90 days' + i * interval '1 minute' AS t) tt
			RETURNING operation_id, finished_at)
		INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, at)
		SELECT 'op:' || operation_id, 'op.transition', 'PROCESSING', 'SUCCEEDED', 'outbox', finished_at FROM ops`)
	require.NoError(t, err)

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
		for _, s := range []string{
			`LOAD 'auto_explain'`,
			`SET auto_explain.log_min_duration = 0`,
			`SET auto_explain.log_nested_statements = on`,
			`SET auto_explain.log_level = notice`,
			`SET jit = on`,
			`SET jit_above_cost = 0`,
			`SET jit_inline_above_cost = 0`,
			`SET jit_optimize_above_cost = 0`,
		} {
			if _, err := conn.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Skipf("auto_explain cannot be loaded per session here (it needs a superuser): %v", err)
	}
	jitted := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, n := range notices {
			if strings.Contains(n, "stepwise_") && strings.Contains(n, "JIT:") {
				out = append(out, n)
			}
		}
		notices = nil
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
