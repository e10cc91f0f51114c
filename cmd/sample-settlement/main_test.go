package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// argsSep separates the command line a child role receives in SS_ARGS.
const argsSep = "\x1f"

func init() {
	// "cli" runs one command of this binary in a child process, as a user would run it:
	// the end-to-end test starts serve processes with it.
	workflowtest.RegisterRole("cli", func(ctx context.Context, env map[string]string) error {
		args := strings.Split(env["SS_ARGS"], argsSep)
		if code := prog.Run(ctx, args, os.Stdout, os.Stderr); code != 0 {
			return &exitError{code: code}
		}
		return nil
	})
}

type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit code %d", e.code) }

func TestMain(m *testing.M) {
	code := testkit.Main(m)
	os.Exit(code)
}

// testDate is the business date of the seeded template.
var testDate = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

const testDateText = "2026-03-01"

// seededDBURL is a fresh database with the schema and a small data set, cloned from a
// template seeded once per schema version.
func seededDBURL(t *testing.T) string {
	t.Helper()
	return testkit.TemplateDBURL(t, "main_"+settlement.SchemaID(), func(ctx context.Context, pool *pgxpool.Pool) error {
		if err := settlement.ApplySchema(ctx, pool); err != nil {
			return err
		}
		_, err := settlement.Seed(ctx, pool, &settlement.SeedConfig{Date: testDate, Merchants: 800, Transactions: 8000, ClosedAccounts: 0.01, Seed: 11})
		return err
	})
}

// result is what one command printed and how it exited.
type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs a command in this process, as main would, with a context the test owns.
func runCLI(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := prog.Run(ctx, args, &out, &errOut)
	r := result{code: code, stdout: out.String(), stderr: errOut.String()}
	t.Logf("sample-settlement %s → exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, r.stdout, r.stderr)
	return r
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a command's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// waitDateAtRest waits until date is at rest (every run finished, every payout proven or
// MANUAL) for as long as the database shows the processes working: steps committed, payouts
// at rest, events written. It fails after testkit.StallTimeoutDefault with nothing moving.
//
// Guards against: a test that fails for time rather than for a bug. Fixed deadlines of one or
// two minutes held on a quiet machine and expired at load 30-53 on two cores while the date
// was still settling; only processes that stop moving must fail.
func waitDateAtRest(t *testing.T, pool *pgxpool.Pool, plan settlement.Plan, date time.Time) *settlement.Progress {
	t.Helper()
	var p *settlement.Progress
	defer func() {
		if t.Failed() && p != nil {
			t.Logf("%s not at rest: runs %v payouts %v", date.Format(time.DateOnly), p.Runs, p.Operations)
		}
	}()
	testkit.WaitProgress(t, date.Format(time.DateOnly)+" at rest", 0, 0, func(ctx context.Context) (bool, int64, error) {
		var err error
		if p, err = settlement.ReadProgress(ctx, pool, plan, date); err != nil {
			return false, 0, err
		}
		if p.AtRest(plan.Shards) {
			return true, 0, nil
		}
		var progress int64
		err = pool.QueryRow(ctx, `SELECT
			(SELECT coalesce(sum(steps), 0) FROM stepwise_checkpoint) +
			(SELECT count(*) FROM stepwise_operation WHERE state NOT IN ('PENDING', 'PROCESSING')) +
			(SELECT count(*) FROM stepwise_event)`).Scan(&progress)
		return false, progress, err
	})
	return p
}
