-- What a person saw (package console, reconcile.Resolve, workflow.Resume).
--
-- A decision by hand is taken on a screen read minutes earlier. The state alone does not say
-- whether it is still the screen's: an operation can leave MANUAL and come back MANUAL for
-- another reason (resent, then found at the bank with another amount), a run can be resumed,
-- run and fail again. version counts an operation's state changes and a run's status changes:
-- a form carries the version it was rendered from, and the decision is refused when the row
-- has moved since, even if it moved back to the same state (ABA).
--
-- DEFAULT 1 (no table rewrite on PostgreSQL 11+): every existing and new row starts at 1, so
-- 0 is never a version and callers use it for "not checked".
ALTER TABLE stepwise_operation ADD COLUMN version bigint NOT NULL DEFAULT 1;
ALTER TABLE stepwise_run ADD COLUMN version bigint NOT NULL DEFAULT 1;

-- A trigger rather than "version = version + 1" in each UPDATE: every writer of a state
-- (claims, outcomes, the reconciler, resolutions, run claims, releases, finishes, resumes,
-- maintenance, and any added later) moves the version, so no path can forget it and let a
-- stale decision through. The WHEN clause keeps it off the hot path of updates that do not
-- change the state (lease renewals, heartbeats, lookups): the function runs only on a
-- change of state.
CREATE FUNCTION stepwise_bump_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	NEW.version := OLD.version + 1;
	RETURN NEW;
END
$$;

CREATE TRIGGER stepwise_operation_version BEFORE UPDATE OF state ON stepwise_operation
	FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION stepwise_bump_version();
CREATE TRIGGER stepwise_run_version BEFORE UPDATE OF status ON stepwise_run
	FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION stepwise_bump_version();
