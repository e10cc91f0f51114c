package stepwise

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// OperationEnqueueTx writes ops to the operation ledger in tx, as outbox.Enqueue does in a
// step, for code outside the client's jobs: an HTTP handler, a script, a River client of
// another service on the same database. The kinds' dispatchers are woken right after tx
// commits, by this client's waker, so the operations leave within milliseconds rather than at
// the next poll, and tx holds no lock another transaction could wait on for the wake.
// Inside a step (or any job this client works) call outbox.Enqueue(ctx, s.Tx, ...): the
// job's context already carries the client.
func (c *Client) OperationEnqueueTx(ctx context.Context, tx pgx.Tx, ops ...outbox.EnqueueParams) (*outbox.EnqueueResult, error) {
	if err := c.checkPool("OperationEnqueueTx"); err != nil {
		return nil, err
	}
	if tx == nil {
		return nil, errors.New("stepwise: OperationEnqueueTx: tx is nil; pass the transaction that writes the business rows the operations belong to")
	}
	// Guards against a transaction of another database: its operations would be checked
	// against, and woken in, the client's database, and wait there for a poll that never
	// looks at theirs.
	if conn := tx.Conn(); conn != nil {
		got, want := conn.Config(), c.pool.Config().ConnConfig
		if got.Host != want.Host || got.Port != want.Port || got.Database != want.Database {
			return nil, fmt.Errorf("stepwise: OperationEnqueueTx: tx is a transaction of database %q on %s:%d, but the client's pool is of %q on %s:%d: enqueue in a transaction of the client's pool (the ledger the client delivers)",
				got.Database, got.Host, got.Port, want.Database, want.Host, want.Port)
		}
	}
	return outbox.Enqueue(c.local.Context(ctx, c.river), tx, ops...)
}

// OperationGet reads an operation of the ledger.
func (c *Client) OperationGet(ctx context.Context, id uuid.UUID) (*outbox.Operation, error) {
	if err := c.checkPool("OperationGet"); err != nil {
		return nil, err
	}
	return operationGet(ctx, c.pool, id)
}

// OperationGetTx is OperationGet in the caller's transaction.
func (c *Client) OperationGetTx(ctx context.Context, tx pgx.Tx, id uuid.UUID) (*outbox.Operation, error) {
	return operationGet(ctx, tx, id)
}

func operationGet(ctx context.Context, q stepwisetype.DBTX, id uuid.UUID) (*outbox.Operation, error) {
	op, err := outbox.Get(ctx, q, id)
	return op, wrapErr(err)
}

// OperationListParams selects operations for OperationList.
type OperationListParams struct {
	// State selects operations in this state. Required unless RunKey or BusinessKey is set,
	// or NewestFirst.
	State outbox.State
	// Kind selects operations of this kind.
	Kind string
	// RunKey selects the operations this run enqueued.
	RunKey string
	// BusinessKey selects the operations with this business key (exact).
	BusinessKey string
	// Limit caps the result: 0 for 100.
	Limit int
	// NewestFirst lists by creation, newest first, as a person browsing the ledger reads
	// it (the stepwise command's "ops"), and lets State be empty (any state).
	NewestFirst bool
}

// OperationList lists operations, oldest update first (in MANUAL and UNKNOWN_EXTERNAL: the
// ones waiting longest) unless NewestFirst.
func (c *Client) OperationList(ctx context.Context, params *OperationListParams) ([]*outbox.Operation, error) {
	if err := c.checkPool("OperationList"); err != nil {
		return nil, err
	}
	return operationList(ctx, c.pool, params)
}

// OperationListTx is OperationList in the caller's transaction.
func (c *Client) OperationListTx(ctx context.Context, tx pgx.Tx, params *OperationListParams) ([]*outbox.Operation, error) {
	return operationList(ctx, tx, params)
}

func operationList(ctx context.Context, q stepwisetype.DBTX, params *OperationListParams) ([]*outbox.Operation, error) {
	p := OperationListParams{}
	if params != nil {
		p = *params
	}
	return outbox.List(ctx, q, &outbox.ListParams{State: p.State, Kind: p.Kind, RunKey: p.RunKey, BusinessKey: p.BusinessKey, Limit: p.Limit, NewestFirst: p.NewestFirst})
}

// OperationRequestList lists the requests recorded for an operation (one per send begun, and
// claims lost with a dispatcher that died holding them), oldest first.
func (c *Client) OperationRequestList(ctx context.Context, id uuid.UUID) ([]outbox.Request, error) {
	if err := c.checkPool("OperationRequestList"); err != nil {
		return nil, err
	}
	return outbox.Requests(ctx, c.pool, id)
}

// OperationRequestListTx is OperationRequestList in the caller's transaction.
func (c *Client) OperationRequestListTx(ctx context.Context, tx pgx.Tx, id uuid.UUID) ([]outbox.Request, error) {
	return outbox.Requests(ctx, tx, id)
}

// OperationResolveOpts are a person's decision on an operation the reconciler could not
// settle (MANUAL or UNKNOWN_EXTERNAL).
type OperationResolveOpts struct {
	// Outcome is the decision: SUCCEEDED (it happened), FAILED_PERMANENT (it did not and
	// will not) or RETRYABLE (it did not: send it again, under the same id). Required.
	Outcome outbox.State
	// ExpectedVersion is the operation's Version the person saw. Required (1 or more): an
	// operation that moved since, even back to the same state (MANUAL because "never sent",
	// sent again, MANUAL because "the bank holds another amount"), is another question, and
	// the decision is refused with an error matching stepwisetype.ErrChanged (an
	// *outbox.StateChangedError). Nothing is done then.
	ExpectedVersion int64
	// ExpectedState is the state the person saw, checked too when set. Default: the state
	// the operation had at ExpectedVersion (the version fixes it).
	ExpectedState outbox.State
	// Actor names the person, Reason says why; both required and recorded in the ledger's
	// event of the move.
	Actor, Reason string
	// ExternalRef is the external system's reference, when the person found one.
	ExternalRef string
	// NoCallback resolves an operation whose kind this client has no outbox KindConfig for,
	// which it refuses otherwise (an error matching outbox.ErrUnknownKind): set it only when
	// the service registers no outcome callback for the kind (OnOutcome, OnOutcomeBatch), or
	// the business state that moves with the operation stays behind the ledger for good. A
	// kind the client has is always resolved with its callback, in the same transaction.
	NoCallback bool
}

// OperationResolve records a person's decision on a MANUAL or UNKNOWN_EXTERNAL operation,
// only if it is still at opts.ExpectedVersion, with the kind's outcome callback run by the
// client's outbox in the same transaction, and audited in the ledger with Actor and Reason.
// A RETRYABLE decision wakes the kind's dispatcher at commit. It returns the operation as
// it is after.
func (c *Client) OperationResolve(ctx context.Context, id uuid.UUID, opts *OperationResolveOpts) (*outbox.Operation, error) {
	var op *outbox.Operation
	err := c.inTx(ctx, "OperationResolve", func(tx pgx.Tx) error {
		var err error
		op, err = c.OperationResolveTx(ctx, tx, id, opts)
		return err
	})
	return op, err
}

// OperationResolveTx is OperationResolve in the caller's transaction.
func (c *Client) OperationResolveTx(ctx context.Context, tx pgx.Tx, id uuid.UUID, opts *OperationResolveOpts) (*outbox.Operation, error) {
	what := fmt.Sprintf("stepwise.Client.OperationResolve(%s)", id)
	switch {
	case opts == nil:
		return nil, fmt.Errorf("%w: %s: opts are nil: pass OperationResolveOpts with Outcome, ExpectedVersion, Actor and Reason", reconcile.ErrInvalidResolution, what)
	case opts.ExpectedVersion < 1:
		return nil, fmt.Errorf("%w: %s: ExpectedVersion %d: pass the operation's Version as you read it (1 or more); a resolution is never unconditional",
			reconcile.ErrInvalidResolution, what, opts.ExpectedVersion)
	}
	if err := checkActor(what, opts.Actor, opts.Reason); err != nil {
		return nil, fmt.Errorf("%w: %w", reconcile.ErrInvalidResolution, err)
	}
	// Lock the row: guards against a decision on a stale view. The kind, state and version
	// read here are the ones the move below is made on (ResolveTx checks the version again
	// under the same lock); an operation that moved since the person read it is refused
	// here, whatever state it moved to.
	var (
		kind    string
		state   outbox.State
		version int64
	)
	err := tx.QueryRow(ctx, `SELECT kind, state, version FROM stepwise_operation WHERE operation_id = $1 FOR UPDATE`, id).Scan(&kind, &state, &version)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, wrapErr(fmt.Errorf("resolving operation %s: %w", id, outbox.ErrNotFound))
	}
	if err != nil {
		return nil, fmt.Errorf("resolving operation %s: reading it: %w", id, err)
	}
	from := opts.ExpectedState
	if from == "" {
		// The version the person saw fixes the state.
		from = state
	}
	if version != opts.ExpectedVersion || state != from {
		return nil, wrapErr(fmt.Errorf("resolving operation %s: %w", id, &outbox.StateChangedError{OperationID: id,
			Expected: from, Actual: state, ExpectedVersion: opts.ExpectedVersion, ActualVersion: version}))
	}
	rec, err := c.resolverFor(kind, opts.NoCallback)
	if err != nil {
		return nil, err
	}
	if c.wakes != nil {
		// A RETRYABLE decision queues the kind's dispatcher in tx instead of waiting for the
		// outbox's poll, through the client that can insert that job kind (c.wakes).
		ctx = outbox.ContextWithClient(ctx, c.wakes)
	}
	out, err := rec.ResolveTx(ctx, tx, &reconcile.ResolveOpts{
		OperationID: id, Outcome: opts.Outcome, ExpectedState: from, ExpectedVersion: opts.ExpectedVersion,
		Actor: opts.Actor, Reason: opts.Reason, ExternalRef: opts.ExternalRef,
	})
	return out, wrapErr(err)
}

// resolverFor is the reconciler that records a decision on an operation of kind: the
// client's resolver, which runs the kind's outcome callback; or, with noCallback, one that
// knows the kind without a callback and never sends nor looks up (the service's own processes
// do).
func (c *Client) resolverFor(kind string, noCallback bool) (*reconcile.Reconciler, error) {
	if c.resolver != nil && c.outbox != nil && c.outbox.KindConfig(kind) != nil {
		return c.resolver, nil
	}
	// Guards against a resolution that leaves the service's business state behind the
	// ledger for good: the kind's callback is the service's code, which this client lacks.
	if !noCallback {
		return nil, fmt.Errorf("%w: operation kind %q: resolve it through the service that registers the kind (its client, its console), "+
			"which runs the callback in the same transaction; if the service registers no outcome callback for it, set OperationResolveOpts.NoCallback",
			errKindWithoutConfig, kind)
	}
	_, rec, err := noCallbackResolver(c.pool, kind)
	return rec, err
}

// noCallbackResolver is an outbox and reconciler that know kinds, without outcome callbacks,
// and can record a person's decision on their operations and nothing else: they never send
// nor look up (the service's own processes do), and are never started.
func noCallbackResolver(pool outbox.DB, kinds ...string) (*outbox.Outbox, *reconcile.Reconciler, error) {
	obKinds := map[string]*outbox.KindConfig{}
	for _, kind := range kinds {
		if err := outbox.ValidateKind(kind); err != nil {
			return nil, nil, err
		}
		obKinds[kind] = &outbox.KindConfig{Sender: neverSend{}}
	}
	ob, err := outbox.New(pool, &outbox.Config{Kinds: obKinds})
	if err != nil {
		return nil, nil, err
	}
	return ob, reconcile.NewResolver(pool, ob), nil
}

// OperationKinds returns the operation kinds whose operations OperationResolve resolves
// without NoCallback: the kinds of the client's outbox, whose outcome callbacks it runs.
// A console offers Resolve on these.
func (c *Client) OperationKinds() []string {
	if c == nil || c.outbox == nil || c.resolver == nil {
		return nil
	}
	return c.outbox.Kinds()
}

// KindStatements returns the Statement of each configured kind that has one
// (KindConfig.Statement): what reconcile.CompareTotals and the console's Totals page compare
// the ledger with. The console takes them from here unless its config names its own.
func (c *Client) KindStatements() map[string]reconcile.Statement {
	out := map[string]reconcile.Statement{}
	if c == nil || c.config == nil {
		return out
	}
	for name, k := range c.config.Kinds {
		if k != nil && k.Statement != nil {
			out[name] = k.Statement
		}
	}
	return out
}

// neverSend is the Sender of the outbox of a resolution without callback; it is never started.
type neverSend struct{}

func (neverSend) Send(context.Context, *outbox.Operation) (outbox.Receipt, error) {
	return outbox.Receipt{}, outbox.NotSent(errors.New("an operator's resolution does not send operations"))
}
