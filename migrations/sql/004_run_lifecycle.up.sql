-- Run lifecycle (package workflow).
--
-- failures counts what the crash-loop guard is about: takeovers of a worker that vanished and
-- step errors. It is not the number of claims: a long run is claimed once per slice, and
-- counting slices failed healthy hour-long runs on their first crash.
-- It counts failures in a row: failed_at_steps is the checkpoint's steps when the last failure
-- was recorded, and a failure recorded after the run committed steps since then restarts the
-- count at 1. A poison run (an item that kills the worker, a step that always errors) makes no
-- progress between failures and still fails after its job's max attempts; a long run on
-- machines that crash now and then, progressing in between, does not.
ALTER TABLE stepwise_run ADD COLUMN failures integer NOT NULL DEFAULT 0;
ALTER TABLE stepwise_run ADD COLUMN failed_at_steps bigint NOT NULL DEFAULT 0;
-- released_at is set when a worker gives the lease up on purpose (end of a slice, Sleep, a
-- step error) and cleared at the next claim. Until River records the job's new state the job
-- still looks 'running' with no lease; maintenance leaves such a run alone for a grace of one
-- lease past released_at (see workflow/runstate.go).
ALTER TABLE stepwise_run ADD COLUMN released_at timestamptz;
-- wake_at is when the released run is due again (Sleep/Until, River's retry backoff). A
-- takeover of a run whose worker died before River recorded the snooze keeps it.
ALTER TABLE stepwise_run ADD COLUMN wake_at timestamptz;

-- Maintenance's takeover scan starts from expired leases (a worker killed mid-run): few rows,
-- however many runs are pending or asleep. (Every step's commit renews lease_until, so the
-- step's UPDATE of its checkpoint row is no longer a HOT update: one more index entry a step.)
CREATE INDEX stepwise_checkpoint_lease_idx ON stepwise_checkpoint (lease_until) WHERE lease_until IS NOT NULL;
-- Its page of River's running jobs joins back to the run through the job id.
CREATE INDEX stepwise_run_job_idx ON stepwise_run (river_job_id) WHERE status IN ('pending', 'running');
-- Its sweep for runs whose job ended or vanished walks unfinished runs by key, a page a pass.
CREATE INDEX stepwise_run_active_key_idx ON stepwise_run (key) WHERE status IN ('pending', 'running');
-- Cancellations of runs that are not being worked (sleeping, waiting for a retry).
CREATE INDEX stepwise_run_cancel_idx ON stepwise_run (key)
    WHERE cancel_requested_at IS NOT NULL AND status IN ('pending', 'running');
