package bench

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// statementTracer is a pgx tracer that adds up, per statement text, how many times it ran
// and how long the client waited for it. It is how --trace shows where a step's time goes
// (pg_stat_statements is not loaded on a default server): every statement of the pool,
// River's own fetches and completions included.
type statementTracer struct {
	mu    sync.Mutex
	stats map[string]*stmtStat
}

type stmtStat struct {
	n     int
	total time.Duration
}

type traceKey struct{}

type traceStart struct {
	sql   string
	start time.Time
}

func newStatementTracer() *statementTracer { return &statementTracer{stats: map[string]*stmtStat{}} }

func (t *statementTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceKey{}, traceStart{sql: data.SQL, start: time.Now()})
}

func (t *statementTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	s, ok := ctx.Value(traceKey{}).(traceStart)
	if !ok {
		return
	}
	d := time.Since(s.start)
	k := statementLabel(s.sql)
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.stats[k]
	if st == nil {
		st = &stmtStat{}
		t.stats[k] = st
	}
	st.n++
	st.total += d
}

// TraceBatchStart and TraceBatchEnd count a batch as one round trip under one label naming
// its statements in order ("batch: WITH advanced AS ( UPDATE stepwise_checkpoint SET... +
// COMMIT"): a step that continues sends its
// fenced write and COMMIT that way (checkpoint.AdvanceCommit), and without these the trace
// showed neither.
func (t *statementTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	labels := make([]string, 0, data.Batch.Len())
	for _, q := range data.Batch.QueuedQueries {
		l := statementLabel(q.SQL)
		if len(l) > 55 { // so that the whole batch fits a label
			l = l[:52] + "..."
		}
		labels = append(labels, l)
	}
	return context.WithValue(ctx, traceKey{}, traceStart{sql: "batch: " + strings.Join(labels, " + "), start: time.Now()})
}

func (t *statementTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (t *statementTracer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchEndData) {
	t.TraceQueryEnd(ctx, conn, pgx.TraceQueryEndData{})
}

// reset returns the statistics gathered so far and starts afresh.
func (t *statementTracer) reset() map[string]*stmtStat {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.stats
	t.stats = map[string]*stmtStat{}
	return out
}

var (
	spaces   = regexp.MustCompile(`\s+`)
	comments = regexp.MustCompile(`/\*.*?\*/|--[^\n]*`)
)

// statementLabel shortens a statement to something a person recognises in a table.
func statementLabel(sql string) string {
	s := strings.TrimSpace(spaces.ReplaceAllString(comments.ReplaceAllString(sql, " "), " "))
	if len(s) > 90 {
		s = s[:87] + "..."
	}
	return s
}

// printTrace writes the statements of one run, per step.
func printTrace(w io.Writer, title string, stats map[string]*stmtStat, steps int) {
	type row struct {
		label string
		st    *stmtStat
	}
	var rows []row
	var total time.Duration
	for k, v := range stats {
		rows = append(rows, row{k, v})
		total += v.total
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].st.total > rows[j].st.total })
	fmt.Fprintf(w, "\n%s: %d steps, client wait %s per step\n", title, steps, fmtDur(total/time.Duration(max(steps, 1))))
	fmt.Fprintf(w, "  %9s %10s %9s  %s\n", "per step", "wait/step", "mean", "statement")
	for _, r := range rows {
		fmt.Fprintf(w, "  %9.2f %10s %9s  %s\n", float64(r.st.n)/float64(max(steps, 1)),
			fmtDur(r.st.total/time.Duration(max(steps, 1))), fmtDur(r.st.total/time.Duration(r.st.n)), r.label)
	}
}
