-- Retention keeps every run row (its key is what makes Start idempotent, its checkpoint what
-- makes a failed run resumable) and deletes only a finished run's audit events. The row says
-- when its history went, so an operator reading a run without events knows why.
ALTER TABLE stepwise_run ADD COLUMN history_pruned_at timestamptz;

-- Retention's batches walk the succeeded runs whose history is still there, oldest first.
-- The old index covered every finished run, so each batch would step over every run already
-- pruned (all of them, forever); this one holds only what is left to prune. A run resumed and
-- finished again after its history went is prunable again.
DROP INDEX IF EXISTS stepwise_run_finished_idx;
CREATE INDEX stepwise_run_prunable_idx ON stepwise_run (finished_at)
    WHERE status = 'succeeded' AND (history_pruned_at IS NULL OR history_pruned_at < finished_at);
