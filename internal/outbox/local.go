package outbox

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// Local is what Enqueue keeps between calls for one stepwise.Client: the waker that wakes the
// kinds' dispatchers after the enqueuing transaction commits, and the kinds found registered
// in the client's database. Enqueue has only ctx and tx, so it finds the Local in ctx: the
// client's River worker middleware (Middleware, added by Outbox.Install) puts it there for
// every job the client works, steps included, and the client's own calls put it there for
// theirs (Context).
//
// Without a Local in ctx, Enqueue still checks the kinds (a query each call) but wakes
// nothing: the poll delivers. Nothing of it is process-wide: two clients in one process (two databases, or
// two services in one binary) share no state.
type Local struct {
	waker *waker
	// kinds caches the kinds found registered in the client's database, so that Enqueue reads
	// the registry only the first time it meets a kind (a registration is never taken back).
	// A kind not found is never cached: it may be registered a moment later.
	kinds sync.Map // database (databaseKey) + "\x00" + kind -> struct{}
}

// NewLocal returns an empty Local.
func NewLocal() *Local { return &Local{waker: &waker{queued: map[string]int64{}}} }

type localKey struct{}

// Context returns ctx carrying l (and client, when not nil, for the wake), for Enqueue
// outside a job of the client.
func (l *Local) Context(ctx context.Context, client *river.Client[pgx.Tx]) context.Context {
	if client != nil {
		ctx = ContextWithClient(ctx, client)
	}
	return context.WithValue(ctx, localKey{}, l)
}

// Middleware is the River worker middleware that puts l in the context of every job the
// client works.
func (l *Local) Middleware() river.WorkerMiddlewareFunc {
	return func(ctx context.Context, _ *rivertype.JobRow, doInner func(context.Context) error) error {
		return doInner(context.WithValue(ctx, localKey{}, l))
	}
}

// WakeThrough makes l's waker queue the dispatchers through client, whatever River client the
// enqueuing job runs in. For a client that enqueues kinds another process delivers: its own
// River client has no dispatcher worker, and River refuses to insert a job kind its Workers
// bundle lacks, so the wakes go through an insert-only client (no Workers) on the same pool.
// Call it before the first Enqueue with l.
func (l *Local) WakeThrough(client *river.Client[pgx.Tx]) {
	l.waker.mu.Lock()
	defer l.waker.mu.Unlock()
	l.waker.client, l.waker.fixed = client, true
}

// WakeLooks is how many looks l's waker made so far (one statement each).
func (l *Local) WakeLooks() int64 { return l.waker.looks.Load() }

// localFrom returns the Local in ctx, or nil.
func localFrom(ctx context.Context) *Local {
	l, _ := ctx.Value(localKey{}).(*Local)
	return l
}
