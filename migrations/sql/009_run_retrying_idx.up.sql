-- Runs waiting for a retry (workflow.Retrying, the console's crash-loop signal, the metric
-- stepwise_runs_retrying) are found among the unfinished runs that have failures: this keeps
-- that read to those few rows however many runs are pending. failures changes only when a
-- failure is recorded, so the per-slice writes to stepwise_run stay HOT.
CREATE INDEX stepwise_run_failing_idx ON stepwise_run (key)
    WHERE status IN ('pending', 'running') AND failures > 0;
