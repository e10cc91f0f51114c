-- Retention (package retention) deletes finished history in small batches, oldest first.
-- These indexes let each batch find its rows without scanning all history: finished runs
-- by when they finished, audit events by when they were written.
CREATE INDEX stepwise_run_finished_idx ON stepwise_run (finished_at)
    WHERE status IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX stepwise_event_at_idx ON stepwise_event (at);
