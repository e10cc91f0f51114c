-- The operation ledger (packages outbox and reconcile). One row per external operation,
-- keyed by a stable operation_id that is also the idempotency key sent to the external
-- system: an operation is sent under this one id forever, so the external system can apply
-- it at most once however often it is retried or reconciled.
CREATE TABLE stepwise_operation (
    operation_id    uuid        PRIMARY KEY,
    -- kind names the Sender; it also names the River queue of its dispatcher
    -- ("stepwise_outbox_" + kind), hence River's queue-name alphabet and length.
    kind            text        NOT NULL CHECK (kind ~ '^[a-z0-9]+([_-][a-z0-9]+)*$' AND char_length(kind) <= 48),
    business_key    text        NOT NULL CHECK (char_length(business_key) BETWEEN 1 AND 255),
    payload         jsonb       NOT NULL,
    -- sha256 of the payload's canonical jsonb text; shown in conflict errors.
    payload_hash    bytea       NOT NULL,
    -- Optional money fields, explicit rather than buried in the payload, so that the
    -- reconciler can detect an amount mismatch and compare totals with a statement.
    amount          bigint,
    currency        text        CHECK (currency ~ '^[A-Z]{3}$'),
    -- The workflow run that wrote the operation: a batch is complete only when every
    -- operation of its runs is terminal ("batch status by evidence").
    run_key         text,
    state           text        NOT NULL DEFAULT 'PENDING' CHECK (state IN (
                        'PENDING', 'PROCESSING', 'SUCCEEDED', 'FAILED_PERMANENT',
                        'RETRYABLE', 'UNKNOWN_EXTERNAL', 'MANUAL')),
    -- Sends begun (claims). Outcomes are recorded only if attempts still equals the
    -- claim's, so a dispatcher that outlived its lease cannot overwrite a later decision.
    attempts        integer     NOT NULL DEFAULT 0,
    -- Reconciler lookups in the current UNKNOWN_EXTERNAL episode; the same guard for
    -- reconciler passes that overlap.
    checks          integer     NOT NULL DEFAULT 0,
    lease_until     timestamptz,
    leased_by       text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    next_check_at   timestamptz,
    last_sent_at    timestamptz,
    unknown_since   timestamptz,
    external_ref    text,
    last_error      text        CHECK (char_length(last_error) <= 2048),
    last_lookup     text,
    manual_reason   text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    UNIQUE (kind, business_key),
    -- A PROCESSING row without a lease could never be found by crash recovery.
    CHECK (state <> 'PROCESSING' OR lease_until IS NOT NULL),
    CHECK (state <> 'UNKNOWN_EXTERNAL' OR next_check_at IS NOT NULL)
);

-- Partial indexes on the non-terminal states only, so that claiming, crash recovery and
-- reconciling stay as fast with a hundred million finished operations as with none.
CREATE INDEX stepwise_operation_due_idx ON stepwise_operation (kind, next_attempt_at)
    WHERE state IN ('PENDING', 'RETRYABLE');
CREATE INDEX stepwise_operation_lease_idx ON stepwise_operation (kind, lease_until)
    WHERE state = 'PROCESSING';
CREATE INDEX stepwise_operation_unknown_idx ON stepwise_operation (kind, next_check_at)
    WHERE state = 'UNKNOWN_EXTERNAL';
CREATE INDEX stepwise_operation_manual_idx ON stepwise_operation (kind, updated_at)
    WHERE state = 'MANUAL';
CREATE INDEX stepwise_operation_run_key_idx ON stepwise_operation (run_key, state)
    WHERE run_key IS NOT NULL;
-- Totals compare one kind over a period with an external statement.
CREATE INDEX stepwise_operation_created_idx ON stepwise_operation (kind, created_at);

-- Liveness of each kind's dispatcher. River keeps a killed worker's job "running" until its
-- rescuer runs (an hour by default), and that job's uniqueness would swallow every wake of
-- the kind meanwhile. A running dispatcher heartbeats here; the poll starts a takeover
-- dispatcher when the heartbeat is stale.
CREATE TABLE stepwise_outbox_dispatcher (
    kind         text        PRIMARY KEY,
    owner        text        NOT NULL,
    river_job_id bigint,
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);
