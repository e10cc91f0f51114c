package schedule

// MetricsForTest are the Scheduler's collectors, for tests reading single series.
func MetricsForTest(s *Scheduler) *metrics { return s.metrics }
