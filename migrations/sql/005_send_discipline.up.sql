-- Send discipline (outbox and reconcile): what was claimed, what was really sent, and until
-- when a request could still be on the wire.

-- claims counts claims and is the fence a dispatcher records its outcome under (a dispatcher
-- that outlived its claim cannot overwrite a later decision). attempts now counts requests
-- (Send calls begun, or possibly begun by a dispatcher that died holding the claim), so an
-- operator can tell an operation sent twice from one merely claimed twice.
ALTER TABLE stepwise_operation
    ADD COLUMN claims          integer NOT NULL DEFAULT 0,
    -- When the current (or last) claim was taken; leases are not renewed past the kind's
    -- hold limit counted from here.
    ADD COLUMN claimed_at      timestamptz,
    -- The latest moment a request for this operation could still be in flight: the last
    -- request's start plus the send timeout, or the end of the claim it was sent under,
    -- whichever is later. The reconciler's grace period runs from here.
    ADD COLUMN in_flight_until timestamptz;

UPDATE stepwise_operation SET claims = attempts, claimed_at = last_sent_at;

-- One row per request: a Send call begun under a claim, with its outcome once recorded.
-- started_at is NULL when the dispatcher died holding the claim: a request may or may not
-- have begun, and the reconciler settles the operation by asking the external system.
CREATE TABLE stepwise_operation_request (
    operation_id uuid        NOT NULL REFERENCES stepwise_operation ON DELETE CASCADE,
    claim        integer     NOT NULL,
    actor        text        NOT NULL,
    started_at   timestamptz,
    ended_at     timestamptz,
    -- The state the result proved (SUCCEEDED, FAILED_PERMANENT, RETRYABLE, UNKNOWN_EXTERNAL,
    -- MANUAL), or UNKNOWN_EXTERNAL for a claim lost with its dispatcher.
    outcome      text        NOT NULL,
    error        text        CHECK (char_length(error) <= 2048),
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (operation_id, claim)
);

-- The kinds some outbox delivers, registered when an Outbox is installed: Enqueue refuses a
-- kind nobody registered (a typo would otherwise wait PENDING forever, silently).
CREATE TABLE stepwise_outbox_kind (
    kind          text        PRIMARY KEY,
    registered_by text        NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now()
);
