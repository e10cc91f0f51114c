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
