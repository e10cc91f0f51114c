package stepwise

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/stepwise-go/stepwise/outbox"
	"github.com/stepwise-go/stepwise/reconcile"
	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/workflow"
)

// Client is Stepwise's one handle, as river.Client is River's: it owns the River client it
// was built with, the step engine, the operation ledger's dispatchers, the reconciler and the
// scheduler. (Skeleton shared by the branches that build NewClient/Start/Stop and the operator
// actions; each field is set by NewClient.)
type Client struct {
	pool       *pgxpool.Pool
	config     *Config
	river      *river.Client[pgx.Tx]
	engine     *workflow.Engine
	outbox     *outbox.Outbox
	reconciler *reconcile.Reconciler
	scheduler  *schedule.Scheduler // nil when the config has no schedules
}

// Config is the client's one config. (Fields: see the client branch.)
type Config struct{}
