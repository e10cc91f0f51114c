package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/stepwise-lab/chaos"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/pgserver"
)

// Regime "PostgreSQL restarts mid-settle": the sample service settles a date with three worker
// processes against the strict bank, and while runs step and payouts are in flight the
// database server is stopped as a crash would stop it (pg_ctl stop -m immediate: every
// connection dropped, open transactions lost), left down 5 s and started again (crash
// recovery). No process is restarted by hand. Every run must finish, nothing be redone, no
// payout be sent twice or lost: the strict oracle and the sample's invariants, as for the
// chaos profiles, with the outage counted as every worker cut off. The time to recover is
// logged per restart: from the server accepting connections again to the first step
// committed, the first payout settled, and every run that was running at the crash stepping
// again.
//
// It needs a server of its own (Find's server is never stopped): it starts a throwaway
// cluster from the machine's initdb and pg_ctl, and is skipped, saying so, where there are
// none. Bounded: 3,000 merchants, one restart, well under 90 s. STEPWISE_DRILL_FULL=1 runs
// the full size: 20,000 merchants and three restarts. STEPWISE_DRILL_FAILOVER=1 brings the
// server back on another port behind a TCP proxy the workers connect through, as a failover
// moves the primary to another address behind a stable name.
func TestDrillPostgresRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("the PostgreSQL restart drill takes about a minute")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv, err := pgserver.Throwaway(ctx, &pgserver.ThrowawayOptions{Logf: t.Logf})
	if errors.Is(err, pgserver.ErrNoBinaries) {
		t.Skipf("the PostgreSQL restart drill crashes and restarts a server of its own, and this machine has no initdb/pg_ctl/postgres to start one: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })

	merchants, restarts := 3000, 1
	if os.Getenv("STEPWISE_DRILL_FULL") == "1" {
		merchants, restarts = 20000, 3
	}
	failover := os.Getenv("STEPWISE_DRILL_FAILOVER") == "1"

	admin, err := pgx.Connect(ctx, srv.URL)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `CREATE DATABASE drill`)
	require.NoError(t, err)
	require.NoError(t, admin.Close(ctx))
	serverURL := func() string { return strings.Replace(srv.URL, "/postgres?", "/drill?", 1) }
	dbURL := serverURL()
	var proxy *testkit.Proxy
	if failover {
		proxy, dbURL = testkit.NewProxy(t, dbURL)
	}
	pool, err := pgxpool.New(ctx, serverURL())
	require.NoError(t, err)
	require.NoError(t, chaos.Prepare(ctx, pool, &chaos.Config{Merchants: merchants}))
	pool.Close()

	var report []string
	cfg := &chaos.Config{
		Profile:      "pg-restart",
		DatabaseURL:  dbURL,
		Merchants:    merchants,
		Workers:      3,
		Logf:         t.Logf,
		Progress:     testWriter{t},
		QuietTimeout: time.Minute,
		StartWorker: func(env []string) (workflowtest.Worker, error) {
			return workflowtest.Start(t, "chaos-worker", env...), nil
		},
		Fault: func(ctx context.Context) ([]workflowtest.Interval, error) {
			var cut []workflowtest.Interval
			for i := range restarts {
				running, err := waitInFlight(ctx, serverURL(), time.Minute)
				if err != nil {
					return cut, err
				}
				down := time.Now()
				if err := srv.StopImmediate(ctx); err != nil {
					return cut, err
				}
				t.Logf("drill: server stopped (immediate) with %d runs stepping", len(running))
				time.Sleep(5 * time.Second)
				port := 0
				if failover {
					if port, err = freePort(); err != nil {
						return cut, err
					}
				}
				if err := srv.Start(ctx, port); err != nil {
					return cut, err
				}
				up := time.Now()
				if failover {
					proxy.Retarget(fmt.Sprintf("127.0.0.1:%d", srv.Port()))
				}
				cut = append(cut, workflowtest.Interval{From: down, To: up})
				r, err := measureRecovery(ctx, serverURL(), up, running)
				if err != nil {
					return cut, err
				}
				line := fmt.Sprintf("restart %d: down %s; from the server accepting again: first step %s, first payout settled %s, all %d runs stepping again %s",
					i+1, up.Sub(down).Round(100*time.Millisecond), r.firstStep, r.firstPayout, len(running), r.allRuns)
				t.Log("drill: " + line)
				report = append(report, line)
			}
			return cut, nil
		},
	}
	res, err := chaos.Run(ctx, cfg)
	require.NoError(t, err)
	t.Log(res.Summary())
	for _, l := range report {
		t.Log("drill: " + l)
	}
	require.True(t, res.Chaos.Quiet, "the system did not come to rest after the restart: %v", res.Chaos.QuietErr)
	require.Empty(t, res.Violations, "%d violations:\n%s", len(res.Violations), workflowtest.FormatViolations(res.Violations))
	require.True(t, res.OK())
	require.Zero(t, res.Chaos.Kills+res.Chaos.Stops, "no process is restarted by hand in this drill")
	require.Len(t, report, restarts)
}

// waitInFlight waits until runs are stepping and payouts are in flight, and returns the
// running runs' keys.
func waitInFlight(ctx context.Context, url string, timeout time.Duration) ([]string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	deadline := time.Now().Add(timeout)
	for {
		var keys []string
		var processing int
		err := conn.QueryRow(ctx, `SELECT
			coalesce((SELECT array_agg(r.key ORDER BY r.key) FROM stepwise_run r JOIN stepwise_checkpoint c USING (key)
			           WHERE r.status = 'running' AND c.steps > 0), '{}'),
			(SELECT count(*) FROM stepwise_operation WHERE state = 'PROCESSING')`).Scan(&keys, &processing)
		if err != nil {
			return nil, err
		}
		if len(keys) > 0 && processing > 0 {
			return keys, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("drill: no moment with runs stepping (%d) and payouts in flight (%d) within %s", len(keys), processing, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type recovery struct{ firstStep, firstPayout, allRuns time.Duration }

// measureRecovery polls until, after up, a step has committed, a payout has settled and
// every run in running has committed a step (or finished).
func measureRecovery(ctx context.Context, url string, up time.Time, running []string) (recovery, error) {
	var r recovery
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return r, err
	}
	defer conn.Close(ctx)
	deadline := up.Add(2 * time.Minute)
	for r.firstStep == 0 || r.firstPayout == 0 || r.allRuns == 0 {
		var step, payout bool
		var behind int
		err := conn.QueryRow(ctx, `SELECT
			EXISTS (SELECT 1 FROM stepwise_checkpoint WHERE updated_at > $1 AND steps > 0),
			EXISTS (SELECT 1 FROM stepwise_operation WHERE updated_at > $1 AND state IN ('SUCCEEDED', 'FAILED_PERMANENT')),
			(SELECT count(*) FROM stepwise_checkpoint c JOIN stepwise_run r USING (key)
			  WHERE c.key = ANY($2) AND c.updated_at <= $1 AND r.status IN ('pending', 'running'))`, up, running).Scan(&step, &payout, &behind)
		if err != nil {
			return r, err
		}
		since := time.Since(up).Round(10 * time.Millisecond)
		if step && r.firstStep == 0 {
			r.firstStep = since
		}
		if payout && r.firstPayout == 0 {
			r.firstPayout = since
		}
		if behind == 0 && r.allRuns == 0 {
			r.allRuns = since
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("drill: not recovered 2 minutes after the restart: %+v (%d runs not stepping again)", r, behind)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return r, nil
}

// freePort returns a port nothing listens on right now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
