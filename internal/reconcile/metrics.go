package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepwise-go/stepwise/stepwisetype"
)

// metrics are the reconciler's Prometheus metrics: lookups counted in this process, and the
// unknown and manual backlog read from the ledger when scraped.
type metrics struct {
	db    stepwisetype.DBTX
	kinds []string

	lookups       *prometheus.CounterVec
	unknown       *prometheus.Desc
	oldestUnknown *prometheus.Desc
	manual        *prometheus.Desc
}

func newMetrics(db stepwisetype.DBTX, kinds []string) *metrics {
	return &metrics{
		db:    db,
		kinds: kinds,
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_reconcile_lookups_total",
			Help: "Lookups of UNKNOWN_EXTERNAL operations by result: succeeded, failed, pending, not_found, error.",
		}, []string{"kind", "result"}),
		unknown: prometheus.NewDesc("stepwise_reconcile_unknown",
			"Operations in UNKNOWN_EXTERNAL, read from the ledger at scrape time.", []string{"kind"}, nil),
		oldestUnknown: prometheus.NewDesc("stepwise_reconcile_oldest_unknown_seconds",
			"How long the longest-waiting UNKNOWN_EXTERNAL operation has been unknown, read from the ledger at scrape time.", []string{"kind"}, nil),
		manual: prometheus.NewDesc("stepwise_reconcile_manual",
			"Operations in MANUAL, waiting for a person, read from the ledger at scrape time.", []string{"kind"}, nil),
	}
}

// Metrics returns the reconciler's Prometheus collector: unknown count, age of the oldest
// unknown, lookups by result and manual count, per kind.
//
//	prometheus.MustRegister(rec.Metrics())
func (r *Reconciler) Metrics() prometheus.Collector { return r.metrics }

func (m *metrics) lookup(kind, result string) { m.lookups.WithLabelValues(kind, result).Inc() }

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.lookups.Describe(ch)
	ch <- m.unknown
	ch <- m.oldestUnknown
	ch <- m.manual
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.lookups.Collect(ch)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Both states have a partial index, so these stay cheap however long the history.
	rows, err := m.db.Query(ctx, `
		SELECT k,
			(SELECT count(*) FROM stepwise_operation WHERE kind = k AND state = 'UNKNOWN_EXTERNAL'),
			coalesce((SELECT extract(epoch FROM now() - min(unknown_since)) FROM stepwise_operation
				WHERE kind = k AND state = 'UNKNOWN_EXTERNAL'), 0)::float8,
			(SELECT count(*) FROM stepwise_operation WHERE kind = k AND state = 'MANUAL')
		FROM unnest($1::text[]) AS k`, m.kinds)
	if err != nil {
		m.invalid(ch, err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var kind string
		var unknown, manual int64
		var oldest float64
		if err := rows.Scan(&kind, &unknown, &oldest, &manual); err != nil {
			m.invalid(ch, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(m.unknown, prometheus.GaugeValue, float64(unknown), kind)
		ch <- prometheus.MustNewConstMetric(m.oldestUnknown, prometheus.GaugeValue, oldest, kind)
		ch <- prometheus.MustNewConstMetric(m.manual, prometheus.GaugeValue, float64(manual), kind)
	}
	if err := rows.Err(); err != nil {
		m.invalid(ch, err)
	}
}

func (m *metrics) invalid(ch chan<- prometheus.Metric, err error) {
	err = fmt.Errorf("reading the reconciliation backlog: %w", err)
	ch <- prometheus.NewInvalidMetric(m.unknown, err)
	ch <- prometheus.NewInvalidMetric(m.oldestUnknown, err)
	ch <- prometheus.NewInvalidMetric(m.manual, err)
}
