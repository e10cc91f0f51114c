-- A step's fenced write and its COMMIT travel to the server together (checkpoint's
-- AdvanceCommit), saving a round trip per step. That is only safe if a refused write stops the
-- COMMIT: a fenced UPDATE that matches no row is not an error, and the COMMIT behind it would
-- land the zombie's business writes. So the write calls this function when it matched no
-- row: the error aborts the transaction, and the server skips the COMMIT queued behind it.
-- VOLATILE (the default) so that the planner never evaluates it ahead of time.
CREATE FUNCTION stepwise_fenced(run_key text, token bigint) RETURNS float8
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'SWF01',
        MESSAGE = format('stepwise: the step of %s was refused: fencing token %s is no longer current', run_key, token),
        HINT = 'another worker claimed the run after this one lost its lease; this worker''s step is rolled back and the run goes on from the last committed cursor';
END
$$;
