package outbox

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepwise-go/stepwise/stepwisetype"
)

// metrics are the Outbox's Prometheus metrics: counters kept in this process, and gauges read
// from the ledger when scraped (so every process reports the same, database-wide numbers).
type metrics struct {
	db    stepwisetype.DBTX
	kinds []string

	claimed     *prometheus.CounterVec
	sends       *prometheus.CounterVec
	sendSeconds *prometheus.HistogramVec
	moves       *prometheus.CounterVec
	callbacks   *prometheus.CounterVec

	active        *prometheus.Desc
	oldestUnknown *prometheus.Desc
}

func newMetrics() *metrics {
	return &metrics{
		claimed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_outbox_claimed_total",
			Help: "Operations claimed for sending. A claim is not a request: see stepwise_outbox_sends_total.",
		}, []string{"kind"}),
		sends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_outbox_sends_total",
			Help: "Send calls by classified result: succeeded, failed_permanent, retryable, unknown_external; not_started when a stopping dispatcher never called Send; claim_dropped when the claim could not be proven to outlast the send timeout.",
		}, []string{"kind", "result"}),
		sendSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stepwise_outbox_send_seconds",
			Help:    "Duration of Send calls.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 9),
		}, []string{"kind"}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_outbox_transitions_total",
			Help: "Operation transitions written (dispatcher, reconciler and manual) by kind, from and to state; counted when written, before their transaction commits.",
		}, []string{"kind", "from", "to"}),
		callbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_outbox_callback_failures_total",
			Help: "Outcomes not recorded because the outcome callback returned an error; the operation waits for its lease and the reconciler.",
		}, []string{"kind"}),
		active: prometheus.NewDesc("stepwise_outbox_operations",
			"Operations in each state that is not terminal, read from the ledger at scrape time.", []string{"kind", "state"}, nil),
		oldestUnknown: prometheus.NewDesc("stepwise_outbox_oldest_unknown_seconds",
			"Age of the longest-waiting UNKNOWN_EXTERNAL operation, read from the ledger at scrape time.", []string{"kind"}, nil),
	}
}

// Metrics returns the Outbox's Prometheus collector; register it with your registry:
//
//	prometheus.MustRegister(ob.Metrics())
func (o *Outbox) Metrics() prometheus.Collector { return o.metrics }

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.claimed.Describe(ch)
	m.sends.Describe(ch)
	m.sendSeconds.Describe(ch)
	m.moves.Describe(ch)
	m.callbacks.Describe(ch)
	ch <- m.active
	ch <- m.oldestUnknown
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.claimed.Collect(ch)
	m.sends.Collect(ch)
	m.sendSeconds.Collect(ch)
	m.moves.Collect(ch)
	m.callbacks.Collect(ch)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, err := countsActive(ctx, m.db)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(m.active, err)
		return
	}
	// Report zero for every active state of every configured kind, so that an alert on
	// "unknown > 0" resolves when the last one is settled instead of going stale.
	seen := map[[2]string]bool{}
	for _, c := range counts {
		seen[[2]string{c.Kind, string(c.State)}] = true
		ch <- prometheus.MustNewConstMetric(m.active, prometheus.GaugeValue, float64(c.Count), c.Kind, string(c.State))
	}
	for _, k := range m.kinds {
		for _, s := range States() {
			if !s.Terminal() && !seen[[2]string{k, string(s)}] {
				ch <- prometheus.MustNewConstMetric(m.active, prometheus.GaugeValue, 0, k, string(s))
			}
		}
	}
	oldest, err := oldestUnknown(ctx, m.db)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(m.oldestUnknown, err)
		return
	}
	for _, k := range m.kinds {
		ch <- prometheus.MustNewConstMetric(m.oldestUnknown, prometheus.GaugeValue, oldest[k].Seconds(), k)
	}
}

func (m *metrics) claimedN(kind string, n int) {
	if n > 0 {
		m.claimed.WithLabelValues(kind).Add(float64(n))
	}
}

func (m *metrics) sent(kind string, r sendResult) {
	result := "not_started"
	if r.dropped {
		result = "claim_dropped"
	}
	if r.started {
		result = strings.ToLower(string(Classify(r.err)))
		m.sendSeconds.WithLabelValues(kind).Observe(r.elapsed.Seconds())
	}
	m.sends.WithLabelValues(kind, result).Inc()
}

func (m *metrics) transitions(out []OperationOutcome) {
	for _, oo := range out {
		m.moves.WithLabelValues(oo.Op.Kind, string(oo.Outcome.From), string(oo.Outcome.To)).Inc()
	}
}

func (m *metrics) callbackFailed(kind string) { m.callbacks.WithLabelValues(kind).Inc() }
