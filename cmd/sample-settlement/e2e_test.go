package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

var servingRE = regexp.MustCompile(`serving: http://(127\.0\.0\.1:\d+)/metrics`)

// The acceptance test of the service: three serve processes and a bank that misbehaves
// settle a date started by hand with "settle --work=false"; then "invariants" holds and
// "report" shows the batch COMPLETED with totals matching the bank's statement. One process
// is stopped with SIGTERM and shuts down gracefully.
func TestServeThreeProcessesSettleADate(t *testing.T) {
	t.Parallel()
	testkit.Heavy(t) // three serve processes of 24 connections each
	ctx := context.Background()
	dbURL := seededDBURL(t)
	bank := fakebank.New(&fakebank.Config{Seed: 5, Faults: fakebank.Mix{RefuseBeforeApply: 0.02, Error5xxAfterApply: 0.03, DropAfterApply: 0.02}})
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })

	common := []string{"--database-url", dbURL, "--bank-url", bank.URL(), "--shards", "4"}
	var procs []*workflowtest.Process
	for _, id := range []string{"serve-1", "serve-2", "serve-3"} {
		// README: sample-settlement serve
		args := append([]string{"serve", "--addr", "127.0.0.1:0", "--id", id, "--batch-size", "50", "--lease", "5s",
			"--reconcile-interval", "1s", "--reconcile-grace", "3s", "--payout-timeout", "2s", "--shutdown-timeout", "10s", "--metrics-interval", "200ms",
			// Three processes on one server beside the other packages' tests: with the default
			// pool (40 each) they could pass max_connections (100), as a CI run saw ("too many
			// clients already"); 24 each is above what NewClient requires here (14).
			"--db-max-conns", "24"}, common...)
		procs = append(procs, workflowtest.Start(t, "cli", "SS_ARGS="+strings.Join(args, argsSep)))
	}
	var addrs []string
	for _, p := range procs {
		waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
		line, err := p.WaitForLine(waitCtx, "serving: ")
		cancel()
		require.NoError(t, err)
		m := servingRE.FindStringSubmatch(line)
		require.NotNil(t, m, line)
		addrs = append(addrs, m[1])
	}

	// The operator's surface: health, metrics, read-only River UI.
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addrs[0] + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, body := get("/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	code, _ = get("/riverui/")
	require.Equal(t, http.StatusOK, code)
	resp, err := http.Post("http://"+addrs[0]+"/riverui/api/jobs/cancel", "application/json", strings.NewReader(`{"ids":["1"]}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "River UI changes need credentials")

	r := runCLI(t, append([]string{"settle", "--date", testDateText, "--work=false"}, common...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "4 runs started")
	// Settling the same date again finds the same runs: one set of runs per date, forever.
	r = runCLI(t, append([]string{"settle", "--date", testDateText, "--work=false"}, common...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "already started")

	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	plan, err := settlement.Plan{Shards: 4}.Compile()
	require.NoError(t, err)
	waitDateAtRest(t, pool, plan, testDate)

	// Metrics are gathered in the background every --metrics-interval: the next gather
	// shows the date at rest.
	require.Eventually(t, func() bool {
		code, body = get("/metrics")
		return code == http.StatusOK && strings.Contains(body, `stepwise_outbox_operations{kind="payout",state="UNKNOWN_EXTERNAL"} 0`)
	}, 10*time.Second, 100*time.Millisecond, "metrics never showed the date at rest")
	require.Contains(t, body, "stepwise_run_lease_expired_seconds")
	require.Contains(t, body, "go_goroutines")

	r = runCLI(t, append([]string{"invariants", "--date", testDateText}, common...)...)
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "all invariants hold")

	r = runCLI(t, append([]string{"report", "--date", testDateText, "--json"}, common...)...)
	require.Equal(t, 0, r.code, r.stderr)
	var rep settlement.Report
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep))
	require.Equal(t, schedule.BatchCompleted, rep.Batch)
	require.True(t, rep.TotalsMatch(), r.stdout)
	require.Zero(t, rep.DuplicatePayouts)
	require.Empty(t, bank.DuplicateReferences())

	// Graceful shutdown on SIGTERM: in-flight work finishes or is released, exit 0.
	require.NoError(t, procs[0].Signal(syscall.SIGTERM))
	require.NoError(t, procs[0].Wait())
	require.Contains(t, strings.Join(procs[0].Lines(), "\n"), "stopped")
}
