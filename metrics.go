package stepwise

import "github.com/prometheus/client_golang/prometheus"

// clientMetrics are the Client's own metrics, beside its components'.
type clientMetrics struct {
	passes         *prometheus.CounterVec
	withoutChecker *prometheus.GaugeVec
}

func newClientMetrics() *clientMetrics {
	return &clientMetrics{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_client_maintenance_passes_total",
			Help: "Maintenance passes this process's Client ran, by component (workflow, outbox, reconcile, schedule) and result (ok, error).",
		}, []string{"component", "result"}),
		withoutChecker: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stepwise_client_kind_without_checker",
			Help: "1 for each kind this process sends without a Checker: its UNKNOWN_EXTERNAL operations wait for a process that has one.",
		}, []string{"kind"}),
	}
}

// Metrics returns one Prometheus collector for the whole Client: the engine's, the outbox's,
// the reconciler's and the scheduler's metrics, and the Client's own
// (stepwise_client_maintenance_passes_total, stepwise_client_kind_without_checker).
// Register it once:
//
//	prometheus.MustRegister(client.Metrics())
//
// An operator client (NewOperatorClient) runs nothing, and its collector is empty.
func (c *Client) Metrics() prometheus.Collector {
	if c.engine == nil {
		return collectors{}
	}
	cs := collectors{c.metrics.passes, c.metrics.withoutChecker, c.engine.Metrics()}
	if c.outbox != nil {
		cs = append(cs, c.outbox.Metrics())
	}
	if c.reconciler != nil {
		cs = append(cs, c.reconciler.Metrics())
	}
	if c.scheduler != nil {
		cs = append(cs, c.scheduler.Metrics())
	}
	return cs
}

// collectors is several collectors as one.
type collectors []prometheus.Collector

func (cs collectors) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range cs {
		c.Describe(ch)
	}
}

func (cs collectors) Collect(ch chan<- prometheus.Metric) {
	for _, c := range cs {
		c.Collect(ch)
	}
}
