// Package runstart records the start of a workflow run: its row, its checkpoint and the River
// job that delivers it, in the caller's transaction. Package workflow starts runs with it
// (workflow.StartTx, Step.StartChild) and so does package schedule, which alone records a
// run's schedule, slot and shard: workflow.StartOpts has no such fields, so no public caller
// can make a run look like a member of a schedule's slot. Both import this package; neither
// reaches the other through a variable filled in at init.
package runstart

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/checkpoint"
	"github.com/stepwise-go/stepwise/internal/runwait"
	"github.com/stepwise-go/stepwise/internal/tracing"
)

// ErrConflict is workflow.ErrRunConflict: a key already names a run of another workflow,
// input or parent.
var ErrConflict = errors.New("workflow: run key already used for a different run")

// Slot is the slot a run belongs to, as recorded in stepwise_run.
type Slot struct {
	Schedule string
	Time     time.Time
	Shard    int
}

// Params is what a start records besides the key and the args.
type Params struct {
	// Opts are River's options of the run's job; nil for the defaults.
	Opts *river.InsertOpts
	// Slot is set when a schedule starts the run.
	Slot *Slot
	// Parent is the key of the parent run of a child run (Step.StartChild).
	Parent *string
	// TracerProvider gives the tracer of the "stepwise.start" span; nil means the global one.
	TracerProvider trace.TracerProvider
}

// Tx starts the run key of args in tx, as workflow.StartTx documents: a key names one run
// forever, so starting it again with the same workflow, input and parent creates nothing
// (created is false), and with another one fails with ErrConflict.
func Tx(ctx context.Context, client *river.Client[pgx.Tx], tx pgx.Tx, key string, args river.JobArgs, p Params) (created bool, err error) {
	ctx, span := tracing.Tracer(p.TracerProvider).Start(ctx, "stepwise.start")
	defer func() { endSpan(span, key, args, created, err) }()
	if err := checkpoint.ValidateKey(key); err != nil {
		return false, fmt.Errorf("starting run: %w", err)
	}
	input, err := json.Marshal(args)
	if err != nil {
		return false, fmt.Errorf("starting run: encoding input of run %q: %w", key, err)
	}
	kind := args.Kind()
	var (
		schedule *string
		slot     *time.Time
		shard    *int
	)
	if in := p.Slot; in != nil {
		sl, sh := in.Time.UTC(), in.Shard
		schedule, slot, shard = &in.Schedule, &sl, &sh
	}
	if err := checkpoint.Ensure(ctx, tx, key); err != nil {
		return false, err
	}
	// Guards: a key started twice (ON CONFLICT: the existing run stands).
	tag, err := tx.Exec(ctx, `INSERT INTO stepwise_run (key, workflow, input, schedule, slot, shard, parent_key)
		VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (key) DO NOTHING`,
		key, kind, input, schedule, slot, shard, p.Parent)
	if err != nil {
		return false, fmt.Errorf("starting run: recording run %q: %w", key, err)
	}
	if tag.RowsAffected() != 1 {
		return false, sameRun(ctx, tx, key, kind, input, p.Parent)
	}

	insertOpts := river.InsertOpts{}
	if p.Opts != nil {
		insertOpts = *p.Opts
	}
	if insertOpts.Metadata, err = WithRunKey(ctx, insertOpts.Metadata, key); err != nil {
		return false, fmt.Errorf("starting run: run %q: InsertOpts.Metadata: %w", key, err)
	}
	res, err := client.InsertTx(ctx, tx, args, &insertOpts)
	if err != nil {
		return false, fmt.Errorf("starting run: inserting River job for run %q: %w", key, err)
	}
	// Links the run to the job that delivers it. Guards: a second link of the same run (the
	// run must still be pending with no job).
	var n int
	if err := tx.QueryRow(ctx, `
		WITH r AS (
			UPDATE stepwise_run SET river_job_id = $2
			 WHERE key = $1 AND status = 'pending' AND river_job_id IS NULL RETURNING key
		), ev AS (
			INSERT INTO stepwise_event (subject, kind, to_state, detail)
			SELECT key, 'run.start', 'pending', jsonb_build_object('river_job_id', $2::bigint) FROM r
		)
		SELECT count(*) FROM r`, key, res.Job.ID).Scan(&n); err != nil || n == 0 {
		if err == nil {
			err = errors.New("workflow: the run changed state meanwhile (finished, or taken over by another job)")
		}
		return false, fmt.Errorf("starting run: linking run %q to its job: %w", key, err)
	}
	return true, nil
}

// sameRun checks that the existing run key is the one being started again: same workflow,
// input and parent. Otherwise it is ErrConflict.
func sameRun(ctx context.Context, tx pgx.Tx, key, kind string, input []byte, parent *string) error {
	var (
		workflow, had string
		same          bool
		hadParent     *string
	)
	if err := tx.QueryRow(ctx, `SELECT workflow, input::text, input = $2::jsonb, parent_key FROM stepwise_run WHERE key = $1`,
		key, input).Scan(&workflow, &had, &same, &hadParent); err != nil {
		return fmt.Errorf("starting run: comparing run %q: %w", key, err)
	}
	if workflow != kind || !same {
		return fmt.Errorf("%w: key %q is run of %s with input %s; this start is %s with input %s",
			ErrConflict, key, workflow, had, kind, input)
	}
	if deref(hadParent) != deref(parent) {
		return fmt.Errorf("%w: key %q is a run whose parent is %q; this start's parent is %q",
			ErrConflict, key, deref(hadParent), deref(parent))
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// WithRunKey returns the job metadata naming the run key, and carrying the traceparent of
// ctx's span (the start's or the takeover's) when there is one, so that the attempts the job
// delivers link back to what queued it, hours later and in another process.
func WithRunKey(ctx context.Context, metadata []byte, key string) ([]byte, error) {
	m := map[string]any{}
	if len(metadata) > 0 {
		if err := json.Unmarshal(metadata, &m); err != nil {
			return nil, err
		}
	}
	m[runwait.MetadataRunKey] = key
	if tp := tracing.TraceParent(ctx); tp != "" {
		m[runwait.MetadataTraceParent] = tp
	} else {
		delete(m, runwait.MetadataTraceParent)
	}
	return json.Marshal(m)
}

// endSpan records what a start did on its span, when the span records.
func endSpan(span trace.Span, key string, args river.JobArgs, created bool, err error) {
	if span.IsRecording() {
		span.SetAttributes(attribute.String("stepwise.run.key", key), attribute.String("stepwise.workflow", args.Kind()))
		if err == nil {
			span.SetAttributes(attribute.Bool("stepwise.run.created", created))
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}
