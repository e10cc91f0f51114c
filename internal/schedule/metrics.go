package schedule

import "github.com/prometheus/client_golang/prometheus"

// metrics are a Scheduler's Prometheus collectors, labelled by schedule. They count
// what this process's ticks committed; sum them across processes. Scheduler.Metrics returns
// them as one prometheus.Collector.
type metrics struct {
	// StartLag is run start minus slot time, in seconds (stepwise_schedule_start_lag_seconds):
	// from the slot's time to the first claim of its first run by a worker, observed by the
	// tick after the run started. It is the lag a schedule's users feel: tick interval,
	// misfires, buffering and queueing in River all add to it.
	StartLag *prometheus.HistogramVec

	// MaterializeLag is the time the slot's runs were inserted minus the slot's time
	// (stepwise_schedule_materialize_lag_seconds): the scheduler's own share of StartLag.
	MaterializeLag *prometheus.HistogramVec

	// Misfires counts slots decided more than two tick intervals after their time, i.e.
	// slots the ticks missed (stepwise_schedule_misfires_total).
	Misfires *prometheus.CounterVec

	// SkippedSlots counts slots recorded as skipped, by reason code
	// (stepwise_schedule_skipped_slots_total{reason}).
	SkippedSlots *prometheus.CounterVec

	// Slots counts slots materialized or buffered (stepwise_schedule_slots_total{decision}).
	Slots *prometheus.CounterVec

	// Ticks counts ticks by result: ok, locked (another tick held the schedule), paused,
	// error (stepwise_schedule_ticks_total{result}).
	Ticks *prometheus.CounterVec
}

// newMetrics returns unregistered collectors. Every Scheduler has its own.
func newMetrics() *metrics {
	lagBuckets := []float64{0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600, 6 * 3600, 24 * 3600}
	return &metrics{
		StartLag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stepwise_schedule_start_lag_seconds",
			Help:    "Run start (first claim of the slot's first run) minus the slot's time.",
			Buckets: lagBuckets,
		}, []string{"schedule"}),
		MaterializeLag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stepwise_schedule_materialize_lag_seconds",
			Help:    "Time the slot's runs were inserted minus the slot's time.",
			Buckets: lagBuckets,
		}, []string{"schedule"}),
		Misfires: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_schedule_misfires_total",
			Help: "Slots decided more than two tick intervals after their time.",
		}, []string{"schedule"}),
		SkippedSlots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_schedule_skipped_slots_total",
			Help: "Slots recorded as skipped, by reason.",
		}, []string{"schedule", "reason"}),
		Slots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_schedule_slots_total",
			Help: "Slots materialized or buffered.",
		}, []string{"schedule", "decision"}),
		Ticks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepwise_schedule_ticks_total",
			Help: "Schedule ticks by result (ok, locked, paused, error).",
		}, []string{"schedule", "result"}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.StartLag, m.MaterializeLag, m.Misfires, m.SkippedSlots, m.Slots, m.Ticks}
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}
