-- Runs that wait (package workflow: WaitForOperations, WaitForChildren, WaitForSignal).
--
-- A waiting run holds no worker and no lease: its step committed the wait together with a
-- River job scheduled at the wait's deadline (the timeout), and the run's river_job_id names
-- that job. The transaction that satisfies the wait (an operation's last outcome, a child's
-- finish, a signal) makes the run due at once in the same transaction: it cancels the
-- timeout job and inserts one that is available now (docs/design.md, "Waits").

-- The run that started this one in its step (Step.StartChild): cancel and resume of the
-- parent reach its children, and a child's finish wakes a parent waiting for it.
ALTER TABLE stepwise_run ADD COLUMN parent_key text;
CREATE INDEX stepwise_run_parent_idx ON stepwise_run (parent_key, status) WHERE parent_key IS NOT NULL;

-- A run's open wait: at most one, from the step that waited until the step after it, which
-- deletes it in its own transaction.
CREATE TABLE stepwise_wait (
    run_key        text        PRIMARY KEY REFERENCES stepwise_run (key),
    kind           text        NOT NULL CHECK (kind IN ('operations', 'children', 'signal')),
    -- operations: MANUAL counts as at rest (else only once a person resolved it).
    manual_at_rest boolean     NOT NULL DEFAULT false,
    -- children: the child runs waited for; NULL is every child of the run.
    children       text[],
    -- signal: the signal's name.
    signal_name    text,
    since          timestamptz NOT NULL DEFAULT now(),
    deadline       timestamptz NOT NULL,
    -- Set by the transaction that made the run due (the condition held, or maintenance); the
    -- step after the wait still re-checks the condition in its own transaction.
    woken_at       timestamptz,
    woken_by       text,
    CHECK (kind <> 'signal' OR signal_name IS NOT NULL)
);
-- Maintenance's backstop for a wake that was lost: only the woken waits not yet taken up,
-- a few rows however many runs wait.
CREATE INDEX stepwise_wait_woken_idx ON stepwise_wait (woken_at) WHERE woken_at IS NOT NULL;

-- Signals (workflow.Signal). Durable: a signal sent before the run waits is kept until a wait
-- takes it; one sent twice with the same id is one signal.
CREATE TABLE stepwise_signal (
    run_key     text        NOT NULL CHECK (char_length(run_key) BETWEEN 1 AND 255),
    name        text        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
    signal_id   text        NOT NULL CHECK (char_length(signal_id) BETWEEN 1 AND 255),
    payload     jsonb,
    sent_at     timestamptz NOT NULL DEFAULT now(),
    -- Set by the step after the wait that took it, in that step's transaction.
    consumed_at timestamptz,
    PRIMARY KEY (run_key, name, signal_id)
);
CREATE INDEX stepwise_signal_pending_idx ON stepwise_signal (run_key, name, sent_at) WHERE consumed_at IS NULL;
