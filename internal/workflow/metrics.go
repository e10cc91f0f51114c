package workflow

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// engineMetrics are the Engine's Prometheus metrics: counters of what this process did, and
// gauges read from the database at scrape time (every process reports the same,
// database-wide numbers for them).
type engineMetrics struct {
	e *Engine

	steps     *prometheus.CounterVec
	stepErrs  *prometheus.CounterVec
	fenced    *prometheus.CounterVec
	finished  *prometheus.CounterVec
	takeovers prometheus.Counter
	// awaitReleases counts runs released untouched for a worker that reads their cursor.
	awaitReleases *prometheus.CounterVec

	active      *prometheus.Desc
	oldestStale *prometheus.Desc
	retrying    *prometheus.Desc
	inARowMax   *prometheus.Desc
	awaiting    *prometheus.Desc
	waiting     *prometheus.Desc
}

func newEngineMetrics(e *Engine) *engineMetrics {
	return &engineMetrics{
		e: e,
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_steps_committed_total",
			Help: "Steps committed by this process (business writes + cursor, fenced).",
		}, []string{"workflow"}),
		stepErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_step_errors_total",
			Help: "Steps that returned an error or panicked and were rolled back; River retries them.",
		}, []string{"workflow"}),
		fenced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_commits_fenced_total",
			Help: "Commits refused because another worker had taken the run over (a zombie's work, discarded).",
		}, []string{"workflow"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_runs_finished_total",
			Help: "Runs this process finished, by final status.",
		}, []string{"workflow", "status"}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stepwise_takeovers_total",
			Help: "Runs re-enqueued by this process's maintenance after their worker vanished.",
		}),
		awaitReleases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_cursor_version_releases_total",
			Help: "Runs this process released untouched because their committed cursor's version is newer than its stepper reads (an old worker during a rolling deploy); a worker that reads it takes them.",
		}, []string{"workflow"}),
		awaiting: prometheus.NewDesc("stepwise_runs_awaiting_newer_worker",
			"Unfinished runs waiting for a worker that reads their committed cursor's version (Run.Awaiting), by workflow, read at scrape time: a deploy that left only old workers.", []string{"workflow"}, nil),
		active: prometheus.NewDesc("stepwise_runs_active",
			"Unfinished runs by workflow and status, read from stepwise_run at scrape time.", []string{"workflow", "status"}, nil),
		oldestStale: prometheus.NewDesc("stepwise_run_lease_expired_seconds",
			"How long the longest-expired lease of an unfinished run has been expired (0 when none): a run nobody is working.", nil, nil),
		retrying: prometheus.NewDesc("stepwise_runs_retrying",
			"Unfinished runs waiting for a retry after failing (no worker holds them; their status says running), by workflow, read at scrape time.", []string{"workflow"}, nil),
		inARowMax: prometheus.NewDesc("stepwise_run_failures_in_a_row_max",
			"The most failures in a row (without a committed step between them) of a run waiting for a retry, by workflow: a crash loop nears its job's max attempts.", []string{"workflow"}, nil),
		waiting: prometheus.NewDesc("stepwise_runs_waiting",
			"Unfinished runs waiting (WaitForOperations, WaitForChildren, WaitForSignal), holding no worker, by workflow and what they wait for, read at scrape time.", []string{"workflow", "wait"}, nil),
	}
}

// Metrics returns the Engine's Prometheus collector; register it with your registry:
//
//	prometheus.MustRegister(engine.Metrics())
func (e *Engine) Metrics() prometheus.Collector { return e.metrics }

func (m *engineMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.steps.Describe(ch)
	m.stepErrs.Describe(ch)
	m.fenced.Describe(ch)
	m.finished.Describe(ch)
	m.takeovers.Describe(ch)
	m.awaitReleases.Describe(ch)
	ch <- m.active
	ch <- m.awaiting
	ch <- m.oldestStale
	ch <- m.retrying
	ch <- m.inARowMax
	ch <- m.waiting
}

func (m *engineMetrics) Collect(ch chan<- prometheus.Metric) {
	m.steps.Collect(ch)
	m.stepErrs.Collect(ch)
	m.fenced.Collect(ch)
	m.finished.Collect(ch)
	m.takeovers.Collect(ch)
	m.awaitReleases.Collect(ch)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m.collectWaiting(ctx, ch)
	// Both queries touch only unfinished runs (a partial index), so a long history of
	// finished runs does not make scraping slower.
	rows, err := m.e.pool.Query(ctx, `SELECT workflow, status, count(*), count(*) FILTER (WHERE awaits_cursor_version IS NOT NULL)
		FROM stepwise_run WHERE status IN ('pending', 'running') GROUP BY workflow, status`)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(m.active, err)
		return
	}
	awaiting := map[string]int64{}
	for rows.Next() {
		var wf, status string
		var n, waits int64
		if err := rows.Scan(&wf, &status, &n, &waits); err != nil {
			ch <- prometheus.NewInvalidMetric(m.active, err)
			rows.Close()
			return
		}
		ch <- prometheus.MustNewConstMetric(m.active, prometheus.GaugeValue, float64(n), wf, status)
		awaiting[wf] += waits
	}
	rows.Close()
	for wf, n := range awaiting {
		ch <- prometheus.MustNewConstMetric(m.awaiting, prometheus.GaugeValue, float64(n), wf)
	}
	var stale float64
	err = m.e.pool.QueryRow(ctx, `SELECT coalesce(extract(epoch FROM now() - min(c.lease_until)), 0)
		FROM stepwise_run r JOIN stepwise_checkpoint c ON c.key = r.key
		WHERE r.status IN ('pending', 'running') AND c.lease_until < now()`).Scan(&stale)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(m.oldestStale, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(m.oldestStale, prometheus.GaugeValue, stale)

	// Runs waiting for a retry (runstate.go's rule), from the same candidates as Retrying.
	rows, err = m.e.pool.Query(ctx, `SELECT r.workflow, count(*), max(`+failuresInARowSQL+`)
		FROM (`+retryCandidatesSQL+`) k
		JOIN stepwise_run r ON r.key = k.key`+runJoinsSQL+`
		WHERE `+retryingSQL+`
		GROUP BY r.workflow`)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(m.retrying, err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var wf string
		var n, inARow int64
		if err := rows.Scan(&wf, &n, &inARow); err != nil {
			ch <- prometheus.NewInvalidMetric(m.retrying, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(m.retrying, prometheus.GaugeValue, float64(n), wf)
		ch <- prometheus.MustNewConstMetric(m.inARowMax, prometheus.GaugeValue, float64(inARow), wf)
	}
	if err := rows.Err(); err != nil {
		ch <- prometheus.NewInvalidMetric(m.retrying, err)
	}
}

// collectWaiting reports the waiting runs: one row per open wait, so the count costs what
// the waits are, never the history.
func (m *engineMetrics) collectWaiting(ctx context.Context, ch chan<- prometheus.Metric) {
	rows, err := m.e.pool.Query(ctx, `SELECT r.workflow, w.kind, count(*) FROM stepwise_wait w
		JOIN stepwise_run r ON r.key = w.run_key AND r.status IN ('pending', 'running') GROUP BY r.workflow, w.kind`)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(m.waiting, err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var wf, kind string
		var n int64
		if err := rows.Scan(&wf, &kind, &n); err != nil {
			ch <- prometheus.NewInvalidMetric(m.waiting, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(m.waiting, prometheus.GaugeValue, float64(n), wf, kind)
	}
	if err := rows.Err(); err != nil {
		ch <- prometheus.NewInvalidMetric(m.waiting, err)
	}
}
