-- Durable cron schedules (package workflow). River's own periodic jobs keep their state in
-- the leader's memory, so slots missed across a deploy or a leader change are lost; here the
-- schedule's progress is a row, advanced in the same transaction that inserts the slot's runs.
CREATE TABLE stepwise_schedule (
    -- The name goes into run keys "<name>/<slot>/<shard>", so no '/' (it would make keys
    -- ambiguous) and short enough that a key stays under the checkpoint's 255 characters.
    name       text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
    -- The definition as last registered by code, kept so that a change is visible and
    -- audited (stepwise_event kind 'schedule.changed') and so operators can read it here.
    spec       text        NOT NULL,
    zone       text        NOT NULL,
    gap        text        NOT NULL CHECK (gap IN ('run_after', 'skip')),
    misfire    jsonb       NOT NULL,
    overlap    text        NOT NULL CHECK (overlap IN ('allow_all', 'skip', 'buffer_one', 'buffer_all', 'cancel_other')),
    shards     integer     NOT NULL CHECK (shards >= 1),
    -- The last slot decided (materialized, skipped or buffered). Every slot after it is
    -- still to be decided; none before it will be looked at again. Advanced only in the
    -- transaction that records the decisions, so a crash loses or repeats nothing.
    watermark  timestamptz NOT NULL,
    -- Paused by an operator: ticks decide nothing, the watermark stays, and on resume the
    -- slots missed meanwhile go through the misfire policy like any other outage.
    paused     boolean     NOT NULL DEFAULT false,
    version    integer     NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One row per decided slot, so that skipped and buffered slots are as durable and visible as
-- materialized ones ("every due slot ends completed, failed, or recorded as skipped").
CREATE TABLE stepwise_schedule_slot (
    schedule        text        NOT NULL REFERENCES stepwise_schedule (name),
    slot            timestamptz NOT NULL,
    status          text        NOT NULL CHECK (status IN ('materialized', 'skipped', 'buffered')),
    -- For skipped slots a stable code (misfire_run_latest, misfire_deadline,
    -- catch_up_limit, overlap_skip, overlap_buffer_full, overlap_superseded) ...
    reason          text,
    -- ... and a sentence for people.
    detail          text,
    -- Runs the slot fans out to: the schedule's shard count when it was materialized.
    shards          integer     NOT NULL CHECK (shards >= 1),
    -- The schedule version that decided the slot.
    version         integer     NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- When its runs and River jobs were inserted (buffered slots: later than created_at).
    materialized_at timestamptz,
    -- When the first of its runs was first claimed by a worker: run start, for lag.
    started_at      timestamptz,
    -- When a tick saw every run of the slot finished; the overlap policy waits for it.
    runs_done_at    timestamptz,
    PRIMARY KEY (schedule, slot),
    CHECK (status <> 'skipped' OR reason IS NOT NULL),
    CHECK (status <> 'materialized' OR materialized_at IS NOT NULL)
);

-- Ticks look only at slots still in flight (buffered, or materialized with runs unfinished),
-- so a tick costs the same after ten years of history as after one day.
CREATE INDEX stepwise_schedule_slot_open_idx ON stepwise_schedule_slot (schedule, slot)
    WHERE status = 'buffered' OR (status = 'materialized' AND runs_done_at IS NULL);
