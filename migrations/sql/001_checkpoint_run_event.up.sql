-- Leases, fencing tokens and durable cursors (package checkpoint). One row per run key.
-- fencing_token only ever grows: every claim adds one, so a commit carrying an older token is
-- refused by the fenced UPDATE (a worker paused past its lease cannot write).
CREATE TABLE stepwise_checkpoint (
    key           text        PRIMARY KEY CHECK (char_length(key) BETWEEN 1 AND 255),
    cursor        jsonb,
    owner         text,
    lease_until   timestamptz,
    fencing_token bigint      NOT NULL DEFAULT 0,
    steps         bigint      NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- Runs of step functions (package workflow). The River job is only the delivery vehicle;
-- river_job_id names the job that currently owns delivery of the run, so a stale job (a
-- rescued original after a fast takeover) can recognise itself and exit.
CREATE TABLE stepwise_run (
    key          text        PRIMARY KEY REFERENCES stepwise_checkpoint (key),
    workflow     text        NOT NULL,
    input        jsonb       NOT NULL,
    status       text        NOT NULL DEFAULT 'pending'
                 CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    schedule     text,
    slot         timestamptz,
    shard        integer,
    river_job_id bigint,
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    -- Set by CancelRun; the running step's context is cancelled at its next heartbeat and
    -- the run ends 'cancelled' (cooperative: a step is never killed mid-commit).
    cancel_requested_at timestamptz
);

-- Maintenance scans only unfinished runs; keep that scan independent of history size.
CREATE INDEX stepwise_run_active_idx ON stepwise_run (updated_at)
    WHERE status IN ('pending', 'running');
CREATE INDEX stepwise_run_slot_idx ON stepwise_run (schedule, slot) WHERE schedule IS NOT NULL;

-- Append-only audit trail: one row per transition (claim, release, fenced refusal, finish),
-- never per item, so auditing does not cost throughput.
CREATE TABLE stepwise_event (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject   text        NOT NULL,
    kind      text        NOT NULL,
    from_state text,
    to_state   text,
    actor     text,
    token     bigint,
    attempt   integer,
    detail    jsonb,
    at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stepwise_event_subject_idx ON stepwise_event (subject, id);
