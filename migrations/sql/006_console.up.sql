-- The operator's console (package console) lists operations newest first with keyset
-- pagination, filtered by state or by run, on tables of millions of rows. Without these an
-- operator's "show me the FAILED_PERMANENT payouts" or "the payouts of this run" reads the
-- whole ledger and sorts it on the same database that settles.
--
-- IF NOT EXISTS: on a large existing ledger, build each index beforehand with
-- CREATE INDEX CONCURRENTLY under the same name (this migration runs in one transaction, and
-- a plain CREATE INDEX blocks writes to the table while it builds).
--
-- State filter, per kind (a state alone: one range per kind, merged; kinds are few), and
-- the overview's capped counts per kind and state.
CREATE INDEX IF NOT EXISTS stepwise_operation_console_state_idx ON stepwise_operation (kind, state, created_at, operation_id);

-- Run filter: a settle shard's run holds hundreds of thousands of payouts; (run_key, state)
-- finds them but not in page order. This index does what (run_key, state) did (a slot's
-- operations counted by state) and gives page order per state, so it replaces it: every
-- operation index is written on each insert and each state change, on the delivery path.
CREATE INDEX IF NOT EXISTS stepwise_operation_console_run_idx ON stepwise_operation (run_key, state, created_at, operation_id)
    WHERE run_key IS NOT NULL;
DROP INDEX IF EXISTS stepwise_operation_run_key_idx;

-- "Recent takeovers and refused commits" and the console's own audit trail, without scanning
-- every event ever written (one per claim, transition, release): partial, so the hot event
-- kinds pay nothing for it.
CREATE INDEX IF NOT EXISTS stepwise_event_console_kind_idx ON stepwise_event (kind, id)
    WHERE kind IN ('run.takeover', 'lease.fenced', 'console.action');

-- Runs by status, newest first (the runs list and the overview's counts): a run row changes
-- per step, not per item, so this costs little; without it "failed runs" reads all history.
CREATE INDEX IF NOT EXISTS stepwise_run_console_status_idx ON stepwise_run (status, created_at, key);
