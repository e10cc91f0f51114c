package stepwise

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	wfengine "github.com/stepwise-go/stepwise/internal/workflow"
	"github.com/stepwise-go/stepwise/workflow"
)

// RunStart starts the run key of args's workflow in its own transaction, through the
// Client's River client. A key names one run forever: starting it again (a
// second cron fire, a retried request) returns the same run with Created false.
func (c *Client) RunStart(ctx context.Context, key string, args river.JobArgs, opts *workflow.StartOpts) (*workflow.Run, error) {
	return wfengine.Start(ctx, c.river, key, args, opts)
}

// RunStartTx is RunStart in the caller's transaction. The run and its job
// exist when tx commits, with the caller's own writes.
func (c *Client) RunStartTx(ctx context.Context, tx pgx.Tx, key string, args river.JobArgs, opts *workflow.StartOpts) (*workflow.Run, error) {
	return wfengine.StartTx(ctx, c.river, tx, key, args, opts)
}
