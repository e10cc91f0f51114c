// Package slotrun is the internal path by which package schedule starts the runs of a slot
// with their slot recorded. workflow.StartOpts has no schedule, slot or shard fields, so no
// public caller can make a run look like a member of a schedule's slot; package workflow
// fills in StartTx at init, and package schedule, which imports workflow, calls it.
package slotrun

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
)

// Slot is the slot a run belongs to, as recorded in stepwise_run.
type Slot struct {
	Schedule string
	Time     time.Time
	Shard    int
}

// StartTx starts a run as workflow.StartTx does, recording slot with it. created reports
// whether this call created the run. Set by package workflow's init.
var StartTx func(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, key string, args river.JobArgs, opts *river.InsertOpts, slot Slot) (created bool, err error)
