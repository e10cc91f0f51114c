package schedule

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise/internal/schedule"
	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/workflow"
)

// The scheduler that ticks lives in an internal package, built, installed and run by
// stepwise.Client for the schedules of stepwise.Config.Schedules; this package is what a
// program touches: the Schedule it defines, its policies, the cron Spec and its business
// dates, and the slots and statuses the client reports.

// Schedule defines a durable cron schedule whose slots start runs of A's workflow. Put it
// in stepwise.Config.Schedules (AddTo is how the client registers it).
type Schedule[A river.JobArgs] = schedule.Schedule[A]

// OverlapPolicy decides what happens to a slot that falls due while runs of an earlier slot
// of the same schedule are still pending or running. There is no default: a settlement that
// silently overlapped itself, or silently did not run, would both be wrong somewhere, so the
// schedule must say which it wants.
type OverlapPolicy = schedule.OverlapPolicy

// The overlap policies; see the package documentation, *Overlap*.
const (
	// OverlapAllowAll starts every slot when it is due, whatever is still running.
	OverlapAllowAll = schedule.OverlapAllowAll
	// OverlapSkip records a slot as skipped (reason overlap_skip) when an earlier slot's
	// runs are unfinished.
	OverlapSkip = schedule.OverlapSkip
	// OverlapBufferOne keeps one slot waiting while an earlier slot's runs are unfinished;
	// further slots due meanwhile are skipped (reason overlap_buffer_full).
	OverlapBufferOne = schedule.OverlapBufferOne
	// OverlapBufferAll keeps every slot due while an earlier one is unfinished and starts
	// them one at a time in slot order: runs of the schedule are strictly serial.
	OverlapBufferAll = schedule.OverlapBufferAll
	// OverlapCancelOther cancels the unfinished runs of earlier slots and starts the new
	// slot once they have ended; a slot still waiting when a newer one arrives is skipped
	// (reason overlap_superseded).
	OverlapCancelOther = schedule.OverlapCancelOther
)

// MisfirePolicy decides what happens to slots that fell due while no tick ran: an outage,
// a deploy, a leader change, a paused schedule. Use CatchUpAll, RunLatest or SkipMissed.
type MisfirePolicy = schedule.MisfirePolicy

// CatchUpAll runs every missed slot, oldest first, at most PerTick per tick (default 100);
// beyond Max waiting slots (default 1,000) the oldest are skipped (reason catch_up_limit).
type CatchUpAll = schedule.CatchUpAll

// RunLatest runs only the newest missed slot and skips the older ones (reason
// misfire_run_latest): right for a refresh, wrong for a daily settlement.
type RunLatest = schedule.RunLatest

// SkipMissed runs a slot only if a tick decides it within StartingDeadline of its time;
// later slots are skipped (reason misfire_deadline).
type SkipMissed = schedule.SkipMissed

// Config is the scheduler's part of stepwise.Config. Zero fields take their defaults
// (stepwise.Config.WithDefaults shows them): TickInterval 5s, MaxSlotsPerTick 10,000.
type Config = schedule.Config

// Why a slot was skipped (SkippedSlot.Reason, SlotReport.Reason): stable codes that
// operators filter on and metrics use as labels.
const (
	ReasonCatchUpLimit      = schedule.ReasonCatchUpLimit      // CatchUpAll: more than Max slots were waiting
	ReasonMisfireRunLatest  = schedule.ReasonMisfireRunLatest  // RunLatest: a newer slot was due too
	ReasonMisfireDeadline   = schedule.ReasonMisfireDeadline   // SkipMissed: later than StartingDeadline
	ReasonOverlapSkip       = schedule.ReasonOverlapSkip       // OverlapSkip: earlier runs unfinished
	ReasonOverlapBufferFull = schedule.ReasonOverlapBufferFull // OverlapBufferOne: a slot already waits
	ReasonOverlapSuperseded = schedule.ReasonOverlapSuperseded // OverlapCancelOther: a newer slot came
)

// SkippedSlot is a slot recorded as skipped, and why (one of the Reason… codes).
type SkippedSlot = schedule.SkippedSlot

// Info is a schedule's row: its stored definition and progress (stepwise.Client's
// ScheduleGet and ScheduleList).
type Info = schedule.Info

// SlotReport is a slot's decision and its batch status with the evidence behind it
// (stepwise.Client's SlotGet and SlotList).
type SlotReport = schedule.SlotReport

// The decisions of a slot (SlotReport.Decision).
const (
	SlotMaterialized = schedule.SlotMaterialized
	SlotSkipped      = schedule.SlotSkipped
	SlotBuffered     = schedule.SlotBuffered
)

// RunMissing is the key of SlotReport.Runs that counts shards whose run does not exist.
const RunMissing = schedule.RunMissing

// BatchStatus is a slot's status, derived from evidence (its runs and their operations),
// never from a loop that merely returned.
type BatchStatus = schedule.BatchStatus

// The statuses of a slot; see BatchStatus.
const (
	BatchSkipped        = schedule.BatchSkipped
	BatchBuffered       = schedule.BatchBuffered
	BatchRunning        = schedule.BatchRunning
	BatchReconciling    = schedule.BatchReconciling
	BatchNeedsAttention = schedule.BatchNeedsAttention
	BatchCompleted      = schedule.BatchCompleted
	BatchFailed         = schedule.BatchFailed
	BatchCancelled      = schedule.BatchCancelled
)

// DeriveBatchStatus derives a slot's status from its decision (SlotMaterialized, ...), its
// shard count, its runs by status and its operations by state, first match wins: skipped or
// buffered; a run failed or missing → FAILED; a run cancelled → CANCELLED; a run pending or
// running → RUNNING; an operation MANUAL → NEEDS_ATTENTION; an operation not terminal →
// RECONCILING; otherwise COMPLETED. stepwise.Client's SlotGet does this for a slot; call it
// for runs of your own that a schedule did not start.
func DeriveBatchStatus(decision string, shards int, runs map[string]int, operations map[outbox.State]int) BatchStatus {
	return schedule.DeriveBatchStatus(decision, shards, runs, operations)
}

// RunKey returns the run key of a schedule's slot and shard:
// "<schedule>/<slot in RFC 3339, UTC>/<shard>", e.g. "settle/2026-03-08T07:00:00Z/3".
func RunKey(scheduleName string, slot time.Time, shard int) string {
	return schedule.RunKey(scheduleName, slot, shard)
}

// RunKeys are the keys of a slot's runs, one per shard.
func RunKeys(scheduleName string, slot time.Time, shards int) []string {
	return schedule.RunKeys(scheduleName, slot, shards)
}

// ShardOf returns the shard, in [0, n), of a business key: the 64-bit FNV-1a hash of the
// key's bytes modulo n, fixed forever (changing it would move items between shards of runs
// already started). It panics if n < 1, like a division by zero.
func ShardOf(key string, n int) int { return schedule.ShardOf(key, n) }

// StartSlot starts a slot's runs by hand in tx, under the keys the tick uses, and records the
// slot's decision with them naming actor: the tick that reaches the slot passes over it, and
// the overlap policy counts it while its runs are unfinished. client is
// stepwise.Client.River().
func StartSlot[A river.JobArgs](ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, sch Schedule[A], slot time.Time, actor string) ([]*workflow.Run, error) {
	return schedule.StartSlot(ctx, client, tx, sch, slot, actor)
}

// Spec is a parsed cron spec in a zone: it computes slots from a watermark alone, DST
// included (see the package documentation).
type Spec = schedule.Spec

// ParseSpec parses a cron spec in zone; its error matches ErrInvalidSpec and names the field
// at fault and what to write instead.
func ParseSpec(spec string, zone *time.Location, gap GapPolicy) (*Spec, error) {
	return schedule.ParseSpec(spec, zone, gap)
}

// LoadZone loads an IANA time zone such as "America/New_York" or "UTC". Unlike
// time.LoadLocation it refuses "" and "Local": both name the host's own zone, which differs
// between nodes. Its errors match ErrUnknownZone and name a loadable spelling when one
// differs only in letter case.
func LoadZone(name string) (*time.Location, error) { return schedule.LoadZone(name) }

// GapPolicy decides what a fixed-time spec does with a local time the clock skips.
type GapPolicy = schedule.GapPolicy

// The gap policies.
const (
	// GapRunAfter: a skipped time is due at the first instant after the gap (the default).
	GapRunAfter = schedule.GapRunAfter
	// GapSkip: a skipped time is not due.
	GapSkip = schedule.GapSkip
)

// Errors of schedules, slots and specs. A schedule or slot that does not exist is an error
// matching stepwisetype.ErrNotFound, whose message names it.
var (
	// ErrInvalid: a schedule's definition is wrong; the message names the field and the fix.
	ErrInvalid = schedule.ErrInvalid
	// ErrInvalidSpec: a cron spec does not parse (the message says where).
	ErrInvalidSpec = schedule.ErrInvalidSpec
	// ErrUnknownZone: a zone name is not a usable IANA zone.
	ErrUnknownZone = schedule.ErrUnknownZone
	// ErrNoSlotOnDate, ErrSeveralSlotsOnDate: SlotOn's date has no slot, or several.
	ErrNoSlotOnDate       = schedule.ErrNoSlotOnDate
	ErrSeveralSlotsOnDate = schedule.ErrSeveralSlotsOnDate
	// ErrSlotRunsMissing: StartSlot of a slot that was materialized and whose runs are gone:
	// starting them again would redo the slot's work, settling the date a second time.
	ErrSlotRunsMissing = schedule.ErrSlotRunsMissing
)
