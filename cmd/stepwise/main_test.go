package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/quickstart"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) }

func init() {
	// The README's main, as a team that built its service from the quick start runs it: a
	// pool, a context that SIGTERM ends, and run. Its own process, as in production.
	workflowtest.RegisterRole("quickstart", func(ctx context.Context, env map[string]string) error {
		pool, err := pgxpool.New(context.Background(), env["DATABASE_URL"])
		if err != nil {
			return err
		}
		defer pool.Close()
		return quickstart.Run(ctx, pool, quickstart.NewFakeBank(env["BANK_URL"]))
	})
}

// result is one invocation of the command.
type result struct {
	stdout, stderr string
	code           int
}

// stepwise runs the command in-process on dbURL (appended as --database-url unless empty).
func stepwise(t *testing.T, dbURL string, args ...string) result {
	t.Helper()
	if dbURL != "" {
		args = append(args, "--database-url", dbURL)
	}
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	t.Logf("$ stepwise %s\n%s%s(exit %d)", strings.Join(redactArgs(args), " "), out.String(), errOut.String(), code)
	return result{out.String(), errOut.String(), code}
}

func redactArgs(args []string) []string {
	out := append([]string(nil), args...)
	for i := range out {
		if i > 0 && out[i-1] == "--database-url" {
			out[i] = "$DATABASE_URL"
		}
	}
	return out
}

func (r result) ok(t *testing.T) result {
	t.Helper()
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	return r
}

func (r result) json(t *testing.T, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal([]byte(r.stdout), v), r.stdout)
}

// quickStartDB is a database as a team running the README's quick start has it: the
// quick start's process (a real one) migrated it, settled 2026-11-29 for 20 merchants and
// paid them through the fake bank, which lost its answer to two payouts (UNKNOWN_EXTERNAL:
// the bank applied them, the reconciler has not yet looked them up). Then the process was
// stopped with SIGTERM.
func quickStartDB(t *testing.T) (string, *pgxpool.Pool, *fakebank.Bank) {
	t.Helper()
	ctx := context.Background()
	dbURL := testkit.EmptyDBURL(t) // nobody migrated it: the quick start does
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, quickstart.Schema+`INSERT INTO merchant SELECT generate_series(1, 20);`)
	require.NoError(t, err)
	bank := fakebank.New(&fakebank.Config{Seed: 7})
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	bank.FailNext(2, fakebank.DropAfterApply)
	// The bank's lookups are down while the quick start runs. Guards against: a database
	// whose state depends on the machine's speed. The quick start's reconciler runs a pass
	// every 10 s and finds the payouts whose answer was lost (the bank applied them): on a
	// loaded machine the run took longer than a pass, and the commands found every payout
	// SUCCEEDED instead of the two UNKNOWN_EXTERNAL they are there to show.
	front := httptest.NewServer(lookupsDown{bank: bank.Handler()})
	t.Cleanup(front.Close)
	runQuickStart(t, pool, dbURL, front.URL, func() bool {
		var status string
		var open int
		err := pool.QueryRow(ctx, `SELECT (SELECT status FROM stepwise_run WHERE key = 'settle/2026-11-29'),
			(SELECT count(*) FROM stepwise_operation WHERE state NOT IN ('SUCCEEDED', 'UNKNOWN_EXTERNAL'))`).Scan(&status, &open)
		return err == nil && status == "succeeded" && open == 0
	})
	return dbURL, pool, bank
}

// lookupsDown answers every lookup (GET /payments/{key}) with 503 and passes everything else
// to the bank.
type lookupsDown struct{ bank http.Handler }

func (l lookupsDown) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/payments/") {
		http.Error(w, "lookups unavailable", http.StatusServiceUnavailable)
		return
	}
	l.bank.ServeHTTP(w, r)
}

// runQuickStart runs the quick start's process, paying through the bank at bankURL, until
// done reports true, then SIGTERMs it. It waits for as long as the process makes progress
// (steps committed, events written), not for a fixed time.
func runQuickStart(t *testing.T, pool *pgxpool.Pool, dbURL, bankURL string, done func() bool) {
	t.Helper()
	// Sized as the README says: the client refuses pgxpool's default of max(4, NumCPU).
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	p := workflowtest.Start(t, "quickstart", "DATABASE_URL="+dbURL+sep+"pool_max_conns=30", "BANK_URL="+bankURL)
	testkit.WaitProgress(t, "the quick start's process done", 0, 0, func(ctx context.Context) (bool, int64, error) {
		if done() {
			return true, 0, nil
		}
		// The quick start migrates the database first: until then there is no table to count.
		var migrated bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass('stepwise_event') IS NOT NULL`).Scan(&migrated); err != nil || !migrated {
			return false, 0, err
		}
		var progress int64
		err := pool.QueryRow(ctx, `SELECT (SELECT coalesce(sum(steps), 0) FROM stepwise_checkpoint) +
			(SELECT count(*) FROM stepwise_event)`).Scan(&progress)
		return false, progress, err
	})
	require.NoError(t, p.Signal(syscall.SIGTERM))
	require.NoError(t, p.Wait(), "the quick start exits cleanly on SIGTERM")
}

// startRun starts a run the way the service's code does (workflow.Start), here with an
// insert-only client: it stays pending until a worker takes it.
func startRun(t *testing.T, pool *pgxpool.Pool, key, date string) {
	t.Helper()
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	require.NoError(t, err)
	_, err = workflow.Start(context.Background(), client, key, quickstart.SettleArgs{Date: date}, nil)
	require.NoError(t, err)
}

// snapshot is every row an operator command could change, to prove a refusal changed nothing.
func snapshot(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT concat_ws(' | ',
		(SELECT string_agg(key || ':' || status || ':' || version || ':' || coalesce(cancel_requested_at::text, ''), ',' ORDER BY key) FROM stepwise_run),
		(SELECT string_agg(operation_id || ':' || state || ':' || version, ',' ORDER BY operation_id) FROM stepwise_operation),
		(SELECT count(*) || ' events, last ' || coalesce(max(id), 0) FROM stepwise_event),
		(SELECT count(*) || ' jobs' FROM river_job),
		(SELECT string_agg(name || ':' || paused, ',') FROM stepwise_schedule),
		(SELECT count(*) || ' pruned' FROM stepwise_run WHERE history_pruned_at IS NOT NULL))`).Scan(&s))
	return s
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func column(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) string {
	t.Helper()
	var s string
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&s))
	return s
}

func pgxNew(ctx context.Context, url string) (*pgxpool.Pool, error) { return pgxpool.New(ctx, url) }
