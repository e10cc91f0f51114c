-- A slot is decided by a tick or, since schedule.StartSlot records its decision, by hand:
-- decided_by says who ('scheduler' for a tick, the actor StartSlot was given otherwise).
-- Every slot recorded before this migration was decided by a tick.
ALTER TABLE stepwise_schedule_slot ADD COLUMN decided_by text NOT NULL DEFAULT 'scheduler';

-- StartSlot records the slot's decision in the transaction that starts its runs, also before
-- the schedule's first tick, or in a process without a Scheduler, when the schedule has no
-- row yet. The row is still created by the first tick, with its watermark at that tick: a
-- slot started by hand earlier must not move the watermark back and back-fill the history in
-- between through the misfire policy.
ALTER TABLE stepwise_schedule_slot DROP CONSTRAINT stepwise_schedule_slot_schedule_fkey;

-- Slots started by hand before this migration have runs and no row. Those a tick may still
-- reach (after the schedule's watermark, or no row for the schedule yet) or whose runs are
-- unfinished are recorded now, as StartSlot records them from here on, so that no tick
-- decides them again and the overlap policy counts them. Who started them was not recorded.
-- Older slots whose rows retention deleted (all runs finished, before the watermark) are
-- left alone: no tick reaches them.
INSERT INTO stepwise_schedule_slot (schedule, slot, status, detail, shards, version, created_at, materialized_at, decided_by)
SELECT r.schedule, r.slot, 'materialized',
       'started by hand before slot decisions were recorded (migration 011)',
       count(*), coalesce(max(s.version), 0), min(r.created_at), min(r.created_at), 'unknown'
  FROM stepwise_run r
  LEFT JOIN stepwise_schedule s ON s.name = r.schedule
 WHERE r.schedule IS NOT NULL AND r.slot IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM stepwise_schedule_slot sl WHERE sl.schedule = r.schedule AND sl.slot = r.slot)
 GROUP BY r.schedule, r.slot
HAVING bool_or(r.status IN ('pending', 'running')) OR bool_or(s.name IS NULL) OR r.slot > max(s.watermark);
