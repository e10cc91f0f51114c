package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/trace"

	"github.com/stepwise-go/stepwise/internal/pgtx"
	"github.com/stepwise-go/stepwise/internal/runctx"
	"github.com/stepwise-go/stepwise/internal/tracing"
)

// EnqueueResult reports what Enqueue did.
type EnqueueResult struct {
	// Inserted is the number of new ledger rows.
	Inserted int
	// Existing holds the operations that were already in the ledger with the same id, kind,
	// business key, payload, amount and currency: a step that runs again after a crash
	// enqueues them again, and that is a no-op.
	Existing []*Operation
	// Woken reports whether the kinds' dispatchers will be woken: after the transaction
	// commits, by the Local's waker (see wake.go), or, when the Local cannot wake through
	// the context's River client (a driver without a pool), by a wake queued in tx. It is
	// false when the context carries no client's Local or no River client (a job of a River
	// client stepwise.NewClient did not build, or no job at all); the operations are then
	// picked up by the next poll (Config.PollInterval).
	Woken bool
}

// Enqueue writes ops to the operation ledger in the caller's transaction, as PENDING, and
// makes sure a dispatcher for their kinds will run once tx commits. If tx rolls back, the
// operations vanish with the business writes they belong to: nothing is sent for a step
// that did not commit.
//
// Every kind must have been registered in the database by an Outbox (Register, which
// stepwise.Client.Start calls) or Enqueue fails with ErrUnknownKind naming the kind and the registered ones: a
// mistyped kind would otherwise wait PENDING forever. The check reads the database once per
// kind and process.
//
// Inside a workflow step, an operation without a RunKey gets the step's run key, and one with
// another run's key is refused (ErrInvalidOperation): the run's batch must not count as
// complete while operations it enqueued are unfinished.
//
// An operation whose ID is zero gets OperationID(Kind, BusinessKey). Enqueueing an operation
// that already exists with the same payload (and amount and currency) is a no-op; with
// anything different, under the same id or the same kind and business key, it fails with a
// *ConflictError (errors.Is ErrOperationConflict) and the first row stays as it was. On any
// error no row of this call remains in tx; roll tx back anyway, as with any failed statement.
//
// When ctx holds a span (inside a workflow step: the step's), its W3C traceparent is stored
// with the operations (Operation.TraceParent), and their sends and reconciler checks link to
// it; under a recording span Enqueue adds a "stepwise.enqueue" span of its own.
//
// With a client's Local in ctx (every job the client works, and Local.Context) Enqueue
// arranges for one dispatch job per kind, unique per kind, to be queued by the client's waker
// as soon as tx commits (within tens of milliseconds), so delivery starts at once. It locks
// nothing that a concurrent run's transaction could wait for: the wake is not part of tx.
// Without a Local it wakes nothing, and the poll delivers. Rows are inserted with one
// set-based statement whatever their number.
func Enqueue(ctx context.Context, tx pgx.Tx, ops ...EnqueueParams) (_ *EnqueueResult, err error) {
	if tx == nil {
		return nil, errors.New("outbox.Enqueue: tx is nil; pass the transaction of the step that writes the operations")
	}
	res := &EnqueueResult{}
	if len(ops) == 0 {
		return res, nil
	}
	// Validate everything before the first statement, so that a bad operation leaves tx as
	// it was (a failed statement would abort the caller's whole transaction).
	stepRun, inStep := runctx.From(ctx)
	prepared := make([]EnqueueParams, 0, len(ops))
	for i := range ops {
		op := ops[i]
		if inStep {
			if op.RunKey == "" {
				op.RunKey = stepRun
			} else if op.RunKey != stepRun {
				return nil, fmt.Errorf("%w: kind %q, business key %q: RunKey %q is not the key of the run whose step enqueues it, %q; "+
					"leave RunKey empty inside a step (Enqueue fills it in), or enqueue the operation outside the step",
					ErrInvalidOperation, op.Kind, op.BusinessKey, op.RunKey, stepRun)
			}
		}
		if err := op.prepare(); err != nil {
			return nil, err
		}
		prepared = append(prepared, op)
	}
	prepared, err = dedupe(prepared)
	if err != nil {
		return nil, err
	}
	// A kind no outbox delivers would be committed and wait forever: refuse it here.
	kinds := make([]string, 0, 1)
	for i := range prepared {
		if !slices.Contains(kinds, prepared[i].Kind) {
			kinds = append(kinds, prepared[i].Kind)
		}
	}
	if err := checkKinds(ctx, localFrom(ctx), tx, kinds); err != nil {
		return nil, err
	}
	b := newOpArrays(prepared)

	// The caller's span (the step's, inside a workflow step) is the operations' origin: its
	// traceparent is written with them, and their sends and checks, later and in other
	// traces, link back to it. The enqueue's own span exists only under a recording one.
	var traceParent *string
	if tp := tracing.TraceParent(ctx); tp != "" {
		traceParent = &tp
	}
	if parent := trace.SpanFromContext(ctx); parent.IsRecording() {
		var span trace.Span
		ctx, span = parent.TracerProvider().Tracer(tracing.Scope).Start(ctx, "stepwise.enqueue")
		defer func() { endEnqueueSpan(span, prepared, res, err) }()
	}

	var rows pgx.Rows
	rows, err = tx.Query(ctx, `
		INSERT INTO stepwise_operation (operation_id, kind, business_key, payload, payload_hash, amount, currency, run_key, trace_parent)
		SELECT id, kind, bk, payload, sha256(convert_to(payload::text, 'UTF8')), amount, currency, run_key, $8
		FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::bigint[], $6::text[], $7::text[])
			AS n(id, kind, bk, payload, amount, currency, run_key)
		ON CONFLICT DO NOTHING
		RETURNING operation_id, pg_current_xact_id()::text`,
		b.ids, b.kinds, b.keys, b.payloads, b.amounts, b.currencies, b.runKeys, traceParent)
	if err != nil {
		return nil, fmt.Errorf("inserting %d operations: %w", len(prepared), err)
	}
	// The transaction's id comes back with the rows, in the same round trip: the waker
	// (wake.go) waits for that transaction to commit before it wakes the dispatcher.
	var xid string
	inserted, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (uuid.UUID, error) {
		var id uuid.UUID
		return id, r.Scan(pgtx.UUIDDest(&id), &xid)
	})
	if err != nil {
		return nil, fmt.Errorf("inserting %d operations: %w", len(prepared), err)
	}
	res.Inserted = len(inserted)

	if len(inserted) < len(prepared) {
		existing, err := checkExisting(ctx, tx, prepared, inserted)
		if err != nil {
			// Leave no row of this call behind: the caller may have a reason to carry on
			// with tx (after a savepoint of its own), and must not send half a batch.
			if len(inserted) > 0 {
				if _, delErr := tx.Exec(ctx, `DELETE FROM stepwise_operation WHERE operation_id = ANY($1)`, pgtx.UUIDs(inserted)); delErr != nil {
					return nil, errors.Join(err, fmt.Errorf("removing the operations inserted before the conflict: %w", delErr))
				}
			}
			return nil, err
		}
		res.Existing = existing
	}

	res.Woken, err = wakeOnCommit(ctx, tx, xid, kinds)
	if err != nil {
		return nil, err
	}
	return res, nil
}

// wakeOnCommit makes sure the dispatchers of kinds run once tx (whose id is xid, or "" when
// tx inserted nothing) commits. With the client's Local in ctx it takes no lock that another
// run's transaction could wait on: see wake.go for why the wake comes after the commit.
// Without a River client in ctx it does nothing and reports false (the poll finds the
// operations).
func wakeOnCommit(ctx context.Context, tx pgx.Tx, xid string, kinds []string) (bool, error) {
	client := clientFrom(ctx)
	if client == nil || len(kinds) == 0 {
		return false, nil
	}
	// Without a client's Local (a job of a River client stepwise.NewClient did not build)
	// nothing wakes after the commit, and waking in tx would hold the kind's dispatcher row
	// for every other transaction until tx ends (a River client without the dispatcher's
	// worker refuses the insert besides): the poll delivers.
	l := localFrom(ctx)
	if l == nil {
		return false, nil
	}
	// Without a pool of its own (a River driver built on a transaction only) the client
	// cannot wake after the commit: wake in the transaction.
	if !l.waker.wakeAfterCommit(client, xid, kinds) {
		return wake(ctx, tx, kinds...)
	}
	return true, nil
}

// dedupe drops repeats of an operation within one call, and refuses two different
// operations under one id or one kind and business key: the database could only tell the
// first from the second by position, which one INSERT does not report.
func dedupe(ops []EnqueueParams) ([]EnqueueParams, error) {
	if len(ops) < 2 {
		return ops, nil
	}
	type kk struct{ kind, key string }
	byID := make(map[uuid.UUID]int, len(ops))
	byKey := make(map[kk]int, len(ops))
	out := ops[:0:0]
	for _, op := range ops {
		i, dupID := byID[op.ID]
		j, dupKey := byKey[kk{op.Kind, op.BusinessKey}]
		if !dupID && !dupKey {
			byID[op.ID], byKey[kk{op.Kind, op.BusinessKey}] = len(out), len(out)
			out = append(out, op)
			continue
		}
		if !dupID {
			i = j
		}
		first := out[i]
		if first.ID != op.ID || first.Kind != op.Kind || first.BusinessKey != op.BusinessKey ||
			first.Amount != op.Amount || first.Currency != op.Currency || !sameJSON(first.Payload, op.Payload) {
			return nil, &ConflictError{New: op, Existing: Operation{EnqueueParams: first}}
		}
	}
	return out, nil
}

// sameJSON compares two JSON documents as values, the way jsonb equality does.
func sameJSON(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var va, vb any
	da, db := json.NewDecoder(bytes.NewReader(a)), json.NewDecoder(bytes.NewReader(b))
	da.UseNumber()
	db.UseNumber()
	if da.Decode(&va) != nil || db.Decode(&vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// opArrays holds operations column-wise for unnest; ids as bytes, which pgx sends natively
// (see pgtx.UUIDs).
type opArrays struct {
	ids        [][16]byte
	kinds      []string
	keys       []string
	payloads   []string
	amounts    []*int64
	currencies []*string
	runKeys    []*string
}

func newOpArrays(ops []EnqueueParams) *opArrays {
	b := &opArrays{
		ids:        make([][16]byte, len(ops)),
		kinds:      make([]string, len(ops)),
		keys:       make([]string, len(ops)),
		payloads:   make([]string, len(ops)),
		amounts:    make([]*int64, len(ops)),
		currencies: make([]*string, len(ops)),
		runKeys:    make([]*string, len(ops)),
	}
	for i := range ops {
		op := &ops[i]
		b.ids[i], b.kinds[i], b.keys[i], b.payloads[i] = op.ID, op.Kind, op.BusinessKey, string(op.Payload)
		if op.Currency != "" {
			b.amounts[i], b.currencies[i] = &op.Amount, &op.Currency
		}
		if op.RunKey != "" {
			b.runKeys[i] = &op.RunKey
		}
	}
	return b
}

// checkExisting compares the operations that were not inserted with the rows that stopped
// them. Equal rows are the replay of a step (a no-op); anything else is a conflict.
func checkExisting(ctx context.Context, tx pgx.Tx, ops []EnqueueParams, inserted []uuid.UUID) ([]*Operation, error) {
	var rest []EnqueueParams
	for i := range ops {
		if !slices.Contains(inserted, ops[i].ID) {
			rest = append(rest, ops[i])
		}
	}
	b := newOpArrays(rest)
	// Two lookups per operation (by id, by kind and business key) rather than one OR join,
	// so that both use their unique index even for a replay of a large batch.
	rows, err := tx.Query(ctx, `
		SELECT `+Columns("o")+`, n.ord, sha256(convert_to(n.payload::text, 'UTF8')),
			o.operation_id = n.id AND o.kind = n.kind AND o.business_key = n.bk AND o.payload = n.payload
				AND o.amount IS NOT DISTINCT FROM n.amount AND o.currency IS NOT DISTINCT FROM n.currency
		FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::bigint[], $6::text[])
			WITH ORDINALITY AS n(id, kind, bk, payload, amount, currency, ord)
		JOIN LATERAL (
			SELECT * FROM stepwise_operation WHERE operation_id = n.id
			UNION
			SELECT * FROM stepwise_operation WHERE kind = n.kind AND business_key = n.bk
		) o ON true
		ORDER BY n.ord`,
		b.ids, b.kinds, b.keys, b.payloads, b.amounts, b.currencies)
	if err != nil {
		return nil, fmt.Errorf("reading the operations that already exist: %w", err)
	}
	defer rows.Close()
	var existing []*Operation
	seen := make([]bool, len(rest))
	for rows.Next() {
		var ord int
		var newHash []byte
		var same bool
		op, err := ScanOperation(rows, &ord, &newHash, &same)
		if err != nil {
			return nil, fmt.Errorf("reading the operations that already exist: %w", err)
		}
		seen[ord-1] = true
		if !same {
			return nil, &ConflictError{New: rest[ord-1], Existing: *op, NewPayloadHash: newHash}
		}
		existing = append(existing, op)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the operations that already exist: %w", err)
	}
	for i, ok := range seen {
		if !ok {
			// Not inserted, yet nothing stops it: a row deleted by a concurrent transaction.
			// Refuse rather than report a row that is not there.
			return nil, fmt.Errorf("operation %s (%s %q) was neither inserted nor found; retry the transaction", rest[i].ID, rest[i].Kind, rest[i].BusinessKey)
		}
	}
	return existing, nil
}

// dispatchArgs is the River job that delivers the due operations of one kind. Enqueue and the
// poll insert it unique per kind, so at most one dispatcher per kind is queued or running.
type dispatchArgs struct {
	OperationKind string `json:"operation_kind"`
	// Takeover is set by the poll when the kind's dispatcher job is still "running" in River
	// but its process stopped heartbeating (it was killed): the id of that job, so that the
	// takeover is unique per dead job and not swallowed by it.
	Takeover int64 `json:"takeover,omitempty"`
}

// Kind is the River job kind.
func (dispatchArgs) Kind() string { return "stepwise_outbox_dispatch" }

// InsertOpts puts the job in its kind's queue, unique per kind among jobs that are waiting,
// running or retrying. "completed" is deliberately not a unique state: a wake after the last
// dispatcher finished must queue a new one.
func (a dispatchArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:       QueueName(a.OperationKind),
		MaxAttempts: 1000, // a dispatcher is a loop, not a task: never give up on a kind
		UniqueOpts: river.UniqueOpts{
			ByArgs:  true,
			ByState: dispatchUniqueStates,
		},
	}
}

// QueueName is the River queue of the dispatcher of kind. It is derived from the kind, not
// configured, so that a process that only enqueues (and has no Config) wakes the right queue.
func QueueName(kind string) string { return "stepwise_outbox_" + kind }

type clientKey struct{}

// ContextWithClient returns a context carrying client, for the polls and the reconciler's
// wakes outside a River worker (they wake in their transaction), and, with a Local
// (Local.Context), for Enqueue's wake after the commit. Inside a worker, River's own context
// already carries the client.
func ContextWithClient(ctx context.Context, client *river.Client[pgx.Tx]) context.Context {
	return context.WithValue(ctx, clientKey{}, client)
}

func clientFrom(ctx context.Context) *river.Client[pgx.Tx] {
	if c, ok := ctx.Value(clientKey{}).(*river.Client[pgx.Tx]); ok && c != nil {
		return c
	}
	if c, err := river.ClientFromContextSafely[pgx.Tx](ctx); err == nil {
		return c
	}
	return nil
}

// wake queues, in tx, a dispatcher for each kind, using the River client from ctx (a worker's
// context, or ContextWithClient). It reports false, and does nothing, when ctx has no client:
// the operations are then found by the next poll. Enqueue calls it; so does the reconciler
// when it sends an operation back to RETRYABLE.
//
// The wake is a unique insert. When the kind's dispatcher is already running, River's insert
// takes a row lock on that job until tx commits, and the dispatcher cannot complete while the
// lock is held; it then looks for due operations once more (see Outbox.dispatch). That is what
// makes a wake during a running dispatcher never lost.
func wake(ctx context.Context, tx pgx.Tx, kinds ...string) (bool, error) {
	client := clientFrom(ctx)
	if client == nil || len(kinds) == 0 {
		return false, nil
	}
	sorted := slices.Clone(kinds)
	// A fixed order, so that two transactions waking the same kinds lock their jobs in the
	// same order and cannot deadlock each other.
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	params := make([]river.InsertManyParams, len(sorted))
	for i, k := range sorted {
		params[i] = river.InsertManyParams{Args: dispatchArgs{OperationKind: k}}
	}
	if _, err := client.InsertManyTx(ctx, tx, params); err != nil {
		return false, fmt.Errorf("queueing the dispatcher for %v: %w", sorted, err)
	}
	return true, nil
}
