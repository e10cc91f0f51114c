package console_test

import (
	"context"
	"errors"
	"html"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/workflow"
)

type loopArgs struct{}

func (loopArgs) Kind() string { return "console_loop" }

type loopCursor struct{}

// loopWorker's step always errors: a crash loop in the making.
type loopWorker struct {
	workflow.StepperDefaults[loopArgs, loopCursor]
}

func (loopWorker) Step(context.Context, *workflow.Step[loopArgs, loopCursor]) (workflow.Next, error) {
	return workflow.Next{}, errors.New("bank said 503")
}

// hourRetry is a user's retry policy that retries after an hour.
type hourRetry struct{}

func (hourRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(time.Hour) }

// startLoopingRun runs a real River client with a step that always errors, and waits until
// its run key has failed once and waits for River's retry.
func startLoopingRun(t *testing.T, pool *pgxpool.Pool, key string) {
	t.Helper()
	ctx := context.Background()
	engine, err := workflow.New(pool, &workflow.Config{Lease: time.Second, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	workers := river.NewWorkers()
	workflow.AddWorker(engine, workers, workflow.Stepper[loopArgs, loopCursor](loopWorker{}))
	rc := &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2}},
		Workers:           workers,
		RetryPolicy:       hourRetry{},
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            slog.New(slog.DiscardHandler),
	}
	require.NoError(t, engine.Install(rc))
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	require.NoError(t, client.Start(runCtx))
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = client.Stop(stopCtx)
		cancel()
	})
	_, err = workflow.Start(ctx, client, key, loopArgs{}, &workflow.StartOpts{InsertOpts: &river.InsertOpts{MaxAttempts: 25}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var state string
		err := pool.QueryRow(ctx, `SELECT j.state::text FROM stepwise_run r JOIN river_job j ON j.id = r.river_job_id WHERE r.key = $1`, key).Scan(&state)
		return err == nil && state == "retryable"
	}, 20*time.Second, 20*time.Millisecond, "the run's job never waited for a retry")
}

// Issue: a crash-looping run was invisible for weeks. A step that always errors waited days
// between its tries under River's default back-off, shown meanwhile as 'running' (and counted
// as "sleeping or waiting for a worker") though no worker held it. The run page says it is
// retrying, with its failures in a row against its budget, its next try and its last error;
// the overview lists it as a crash-loop signal.
func TestRetryingRunIsVisibleInTheConsole(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	startLoopingRun(t, f.pool, "looping")

	page := f.get(t, "/console/run?key=looping")
	text := htmlText(page)
	require.True(t, strings.Contains(page, `id="run-retrying"`), "the run page does not say the run is retrying: %s", text)
	require.Contains(t, text, "1 of 25 failures in a row")
	require.Contains(t, text, "next try")
	require.Contains(t, text, "bank said 503")

	overview := f.get(t, "/console/")
	require.True(t, strings.Contains(overview, `id="retrying"`), "the overview has no crash-loop signal: %s", htmlText(overview))
	require.Contains(t, overview, `run?key=looping`)
	require.Contains(t, htmlText(overview), "1 of 25")
}

var tagRE = regexp.MustCompile(`<[^>]*>`)

// htmlText is a page's text: tags removed, entities decoded, runs of space collapsed.
func htmlText(page string) string {
	return strings.Join(strings.Fields(html.UnescapeString(tagRE.ReplaceAllString(page, " "))), " ")
}
