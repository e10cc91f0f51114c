package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	sw "github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

func runOps(ctx context.Context, c *cli, args []string) error {
	return group(ctx, c, args, "list", []command{
		{"list", "list operations, newest first (the default): --kind, --state, --run, --business-key", opsList},
		{"show", "one operation: state, version, attempts, the requests actually sent, its audit trail", opsShow},
		{"resolve", "decide a MANUAL or UNKNOWN_EXTERNAL operation by hand, only if it is still as you saw it, audited", opsResolve},
	})
}

// opRow is an operation as listed.
type opRow struct {
	ID          uuid.UUID    `json:"operation_id"`
	Kind        string       `json:"kind"`
	BusinessKey string       `json:"business_key"`
	State       outbox.State `json:"state"`
	Amount      *int64       `json:"amount,omitempty"`
	Currency    *string      `json:"currency,omitempty"`
	RunKey      *string      `json:"run_key,omitempty"`
	Attempts    int          `json:"attempts"`
	Version     int64        `json:"version"`
	UpdatedAt   time.Time    `json:"updated_at"`
	Why         string       `json:"why,omitempty"`
}

func checkState(path, flagName, s string) (outbox.State, error) {
	st := outbox.State(strings.ToUpper(s))
	for _, known := range outbox.States() {
		if st == known {
			return st, nil
		}
	}
	names := make([]string, 0, len(outbox.States()))
	for _, known := range outbox.States() {
		names = append(names, string(known))
	}
	return "", usageError("%s: --%s %q: want one of %s", path, flagName, s, strings.Join(names, ", "))
}

func opsList(ctx context.Context, c *cli, args []string) error {
	f := c.newFlags("[--kind K] [--state S] [--run KEY] [--business-key BK] [--limit N] [--json]", true, true)
	kind := f.String("kind", "", "only operations of this kind, e.g. payout")
	state := f.String("state", "", "only operations in this state, e.g. MANUAL or UNKNOWN_EXTERNAL")
	runKey := f.String("run", "", "only the operations this run enqueued (its exact key)")
	bk := f.String("business-key", "", "only the operation with this business key (exact), e.g. 2026-11-29/42")
	limit := f.limit(50, "operations")
	if _, err := f.parse(args, 0, 0, ""); err != nil {
		return err
	}
	var st outbox.State
	if *state != "" {
		var err error
		if st, err = checkState(c.path, "state", *state); err != nil {
			return err
		}
	}
	if err := checkLimit(c.path, *limit); err != nil {
		return err
	}
	pool, client, err := f.operator(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	ops, err := client.OperationList(ctx, &sw.OperationListParams{State: st, Kind: *kind, RunKey: *runKey, BusinessKey: *bk, Limit: *limit, NewestFirst: true})
	if err != nil {
		return err
	}
	list := make([]opRow, len(ops))
	rows := make([][]string, len(ops))
	for i, op := range ops {
		o := opRow{ID: op.ID, Kind: op.Kind, BusinessKey: op.BusinessKey, State: op.State, Attempts: op.Attempts, Version: op.Version, UpdatedAt: op.UpdatedAt}
		if op.Amount != 0 || op.Currency != "" {
			o.Amount, o.Currency = &op.Amount, &op.Currency
		}
		if op.RunKey != "" {
			o.RunKey = &op.RunKey
		}
		for _, why := range []string{op.ManualReason, op.LastLookup, op.LastError} {
			if why != "" {
				o.Why = why
				break
			}
		}
		list[i] = o
		rows[i] = []string{o.ID.String(), o.Kind, o.BusinessKey, string(o.State), money(o.Amount, o.Currency), deref(o.RunKey), fmt.Sprint(o.Attempts), fmt.Sprint(o.Version), ts(o.UpdatedAt), oneLine(o.Why, 60)}
	}
	return f.print(listing{json: list, none: "no operations match", rows: rows, limit: *limit, narrow: "--state, --kind, --run",
		header: []string{"OPERATION", "KIND", "BUSINESS KEY", "STATE", "AMOUNT", "RUN", "ATTEMPTS", "VERSION", "UPDATED", "WHY"}})
}

// money shows minor units with the currency, e.g. 1250 EUR as "12.50 EUR" (two decimals:
// the ledger does not know each currency's exponent, so this is a display, not an amount).
func money(amount *int64, currency *string) string {
	if amount == nil {
		return ""
	}
	return fmt.Sprintf("%d %s (minor units)", *amount, deref(currency))
}

func parseOpID(path, s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, usageError("%s: ID %q: want an operation id (a UUID such as 6b1f0c9e-3d0a-5f43-9b52-7f8e0a7d2c11), as \"stepwise ops\" lists it", path, s)
	}
	return id, nil
}

// opShow is "ops show"'s JSON.
type opShow struct {
	*outbox.Operation `json:"-"`
	Op                opJSON           `json:"operation"`
	Requests          []outbox.Request `json:"requests"`
	Events            []event          `json:"events"`
}

// opJSON is an operation in snake_case for scripts. The payload is not shown: it may hold
// account numbers, and the ledger never logs it either.
type opJSON struct {
	ID            uuid.UUID    `json:"operation_id"`
	Kind          string       `json:"kind"`
	BusinessKey   string       `json:"business_key"`
	State         outbox.State `json:"state"`
	Version       int64        `json:"version"`
	Amount        int64        `json:"amount"`
	Currency      string       `json:"currency,omitempty"`
	RunKey        string       `json:"run_key,omitempty"`
	Attempts      int          `json:"attempts"`
	Claims        int          `json:"claims"`
	Checks        int          `json:"checks"`
	LeasedBy      string       `json:"leased_by,omitempty"`
	LeaseUntil    *time.Time   `json:"lease_until,omitempty"`
	NextAttemptAt time.Time    `json:"next_attempt_at"`
	NextCheckAt   *time.Time   `json:"next_check_at,omitempty"`
	LastSentAt    *time.Time   `json:"last_sent_at,omitempty"`
	UnknownSince  *time.Time   `json:"unknown_since,omitempty"`
	ExternalRef   string       `json:"external_ref,omitempty"`
	LastError     string       `json:"last_error,omitempty"`
	LastLookup    string       `json:"last_lookup,omitempty"`
	ManualReason  string       `json:"manual_reason,omitempty"`
	CreatedAt     time.Time    `json:"created_at"`
	UpdatedAt     time.Time    `json:"updated_at"`
	FinishedAt    *time.Time   `json:"finished_at,omitempty"`
}

func toOpJSON(op *outbox.Operation) opJSON {
	return opJSON{ID: op.ID, Kind: op.Kind, BusinessKey: op.BusinessKey, State: op.State, Version: op.Version, Amount: op.Amount,
		Currency: op.Currency, RunKey: op.RunKey, Attempts: op.Attempts, Claims: op.Claims, Checks: op.Checks, LeasedBy: op.LeasedBy,
		LeaseUntil: op.LeaseUntil, NextAttemptAt: op.NextAttemptAt, NextCheckAt: op.NextCheckAt, LastSentAt: op.LastSentAt,
		UnknownSince: op.UnknownSince, ExternalRef: op.ExternalRef, LastError: op.LastError, LastLookup: op.LastLookup,
		ManualReason: op.ManualReason, CreatedAt: op.CreatedAt, UpdatedAt: op.UpdatedAt, FinishedAt: op.FinishedAt}
}

func opsShow(ctx context.Context, c *cli, args []string) error {
	f := c.newFlags("ID [--json]", true, true)
	pos, err := f.parse(args, 1, 1, "ID (the operation id)")
	if err != nil {
		return err
	}
	id, err := parseOpID(c.path, pos[0])
	if err != nil {
		return err
	}
	pool, client, err := f.operator(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var out opShow
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		op, err := client.OperationGetTx(ctx, tx, id)
		if errors.Is(err, stepwisetype.ErrNotFound) {
			return fmt.Errorf("%w: no operation %s; list them with \"stepwise ops\"", errNotFound, id)
		}
		if err != nil {
			return err
		}
		out.Operation = op
		if out.Requests, err = client.OperationRequestListTx(ctx, tx, id); err != nil {
			return err
		}
		// An operation has a handful of events (one per move).
		out.Events, err = readEvents(ctx, tx, "op:"+id.String(), 500, false)
		return err
	})
	if err != nil {
		return err
	}
	if f.json {
		out.Requests, out.Events = nonNil(out.Requests), nonNil(out.Events)
		out.Op = toOpJSON(out.Operation)
		return c.printJSON(out)
	}
	op, w := out.Operation, c.stdout
	fmt.Fprintf(w, "operation    %s\n", op.ID)
	fmt.Fprintf(w, "kind         %s\n", op.Kind)
	fmt.Fprintf(w, "business key %s\n", op.BusinessKey)
	fmt.Fprintf(w, "state        %s (version %d)\n", op.State, op.Version)
	if op.Currency != "" || op.Amount != 0 {
		fmt.Fprintf(w, "amount       %s\n", money(&op.Amount, &op.Currency))
	}
	fmt.Fprintf(w, "run          %s\n", op.RunKey)
	fmt.Fprintf(w, "attempts     %d requests, %d claims, %d checks by the reconciler\n", op.Attempts, op.Claims, op.Checks)
	for _, kv := range [][2]string{{"external ref", op.ExternalRef}, {"last error", op.LastError}, {"last lookup", op.LastLookup}, {"why MANUAL", op.ManualReason}} {
		if kv[1] != "" {
			fmt.Fprintf(w, "%-12s %s\n", kv[0], oneLine(kv[1], 300))
		}
	}
	if op.UnknownSince != nil {
		fmt.Fprintf(w, "unknown since %s; next check %s\n", ts(*op.UnknownSince), tsp(op.NextCheckAt))
	}
	fmt.Fprintf(w, "created      %s; updated %s; finished %s\n", ts(op.CreatedAt), ts(op.UpdatedAt), tsp(op.FinishedAt))
	if op.State == outbox.StateManual || op.State == outbox.StateUnknownExternal {
		fmt.Fprintf(w, "next         stepwise ops resolve %s --to SUCCEEDED|FAILED_PERMANENT|RETRYABLE --seen-version %d --reason \"...\" (see its --help)\n", op.ID, op.Version)
	}
	fmt.Fprintln(w, "\nrequests (one per send begun; a claim lost with its dispatcher may or may not have reached the external system):")
	if len(out.Requests) == 0 {
		fmt.Fprintln(w, "  (none)")
	} else {
		rows := make([][]string, len(out.Requests))
		for i, r := range out.Requests {
			started := "never recorded: the dispatcher died holding the claim"
			if r.StartedAt != nil {
				started = ts(*r.StartedAt)
			}
			rows[i] = []string{"  " + fmt.Sprint(r.Claim), r.Actor, started, tsp(r.EndedAt), string(r.Outcome), oneLine(r.Error, 80)}
		}
		c.table([]string{"  CLAIM", "BY", "STARTED", "ENDED", "OUTCOME", "ERROR"}, rows)
	}
	fmt.Fprintln(w, "\naudit trail (oldest first):")
	printEvents(c, out.Events)
	return nil
}

func opsResolve(ctx context.Context, c *cli, args []string) error {
	f := c.newFlags("ID --to SUCCEEDED|FAILED_PERMANENT|RETRYABLE --reason TEXT --no-callback --seen-version N [--from STATE] [--actor NAME] [--json]", true, true)
	to := f.String("to", "", "the decision: SUCCEEDED (it happened), FAILED_PERMANENT (it did not and will not) or RETRYABLE (send it again, under the same id) (required)")
	from := f.String("from", "", "the state you saw (MANUAL or UNKNOWN_EXTERNAL); refused if the operation has moved since. Default: its current state")
	seen := f.Int64("seen-version", 0, "the operation's version you decided on, as \"stepwise ops show\" prints it; refused if it moved since, even back to the same state (required: without it the command refuses and prints the version the operation has now)")
	noCallback := f.Bool("no-callback", false, "your service registers no outcome callback (OnOutcome, OnOutcomeBatch) for this operation's kind, as the README's quick start; required, see above")
	var a auditFlags
	a.register(f, "why: a ticket, what the external system's support said")
	pos, err := f.parse(args, 1, 1, "ID (the operation id)")
	if err != nil {
		return err
	}
	id, err := parseOpID(c.path, pos[0])
	if err != nil {
		return err
	}
	toState := outbox.State(strings.ToUpper(*to))
	switch toState {
	case outbox.StateSucceeded, outbox.StateFailedPermanent, outbox.StateRetryable:
	case "":
		return usageError("%s: --to is required: SUCCEEDED, FAILED_PERMANENT or RETRYABLE", c.path)
	default:
		return usageError("%s: --to %q: want SUCCEEDED, FAILED_PERMANENT or RETRYABLE", c.path, *to)
	}
	fromState := outbox.State(strings.ToUpper(*from))
	switch fromState {
	case "", outbox.StateManual, outbox.StateUnknownExternal:
	default:
		return usageError("%s: --from %q: only MANUAL and UNKNOWN_EXTERNAL operations are resolved by hand", c.path, *from)
	}
	if err := a.check(c.path); err != nil {
		return err
	}
	if err := seenVersion(c.path, *seen, "stepwise ops"); err != nil {
		return err
	}
	// Guards against a resolution that leaves the service's business state behind the
	// ledger for good: the ledger runs the kind's outcome callback in the resolution's
	// transaction (a settlement marked paid with its payout), and that callback is the
	// service's code, which this command does not have.
	if !*noCallback {
		return usageError("%s: this command cannot run your service's outcome callback for the operation's kind (OnOutcome or OnOutcomeBatch: business state that moves with it). "+
			"If your service registers one, resolve through your service (its console, or its own command), which runs it in the same transaction; "+
			"if it registers none (as the README's quick start), pass --no-callback", c.path)
	}
	// An operator's client knows no kinds: it resolves only with NoCallback (the operator
	// said the kind has no callback), and wakes the service's dispatcher for a RETRYABLE
	// decision through its insert-only River client.
	pool, client, err := f.operator(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cur, err := client.OperationGet(ctx, id)
	if errors.Is(err, stepwisetype.ErrNotFound) {
		return fmt.Errorf("%w: no operation %s; list the ones waiting for a person with \"stepwise ops --state MANUAL\"", errNotFound, id)
	}
	if err != nil {
		return err
	}
	if fromState == "" {
		// "The state I am looking at": read now, and the move below is still conditional on
		// it, so a change in between is refused, not overwritten.
		fromState = cur.State
		if fromState != outbox.StateManual && fromState != outbox.StateUnknownExternal {
			return fmt.Errorf("operation %s (%s %s) is %s: only MANUAL and UNKNOWN_EXTERNAL operations are resolved by hand; nothing was changed", id, cur.Kind, cur.BusinessKey, cur.State)
		}
	}
	if *seen == 0 {
		// Guards against a decision on what the operation is when the command runs rather
		// than on what the person saw: MANUAL, resolved RETRYABLE by a colleague, resent and
		// MANUAL again for another reason ("the bank holds another amount") looks the same
		// by state. Say what it is now; the person confirms it by passing its version.
		return usageError("%s: --seen-version is required: operation %s (%s %s) is %s now (version %d); if that is the operation you decided on, run the command again with --seen-version %d",
			c.path, id, cur.Kind, cur.BusinessKey, cur.State, cur.Version, cur.Version)
	}
	version := *seen
	op, err := client.OperationResolve(ctx, id, &sw.OperationResolveOpts{
		Outcome: toState, ExpectedState: fromState, ExpectedVersion: version, Actor: a.actor, Reason: a.reason, NoCallback: true,
	})
	var changed *outbox.StateChangedError
	switch {
	case errors.As(err, &changed):
		now := string(changed.Actual)
		if changed.ActualVersion != 0 {
			now += fmt.Sprintf(" at version %d", changed.ActualVersion)
		}
		// What the person saw: the version always, the state when they said it (without
		// --from, the state compared was the one read just now, not theirs).
		saw := fmt.Sprintf("version %d", *seen)
		if *from != "" {
			saw = fmt.Sprintf("%s at version %d", fromState, *seen)
		}
		return fmt.Errorf("operation %s (%s %s) is %s now, not %s as you saw: nothing was changed; look again (stepwise ops show %s) before deciding",
			id, cur.Kind, cur.BusinessKey, now, saw, id)
	case errors.Is(err, reconcile.ErrInvalidResolution):
		return usageError("%s: %v", c.path, err)
	case err != nil:
		return err
	}
	if f.json {
		return c.printJSON(map[string]any{"operation": toOpJSON(op), "was": fromState, "actor": a.actor, "reason": a.reason})
	}
	fmt.Fprintf(c.stdout, "operation %s (%s %s) is now %s (version %d), was %s; audited as %q by %s\n",
		op.ID, op.Kind, op.BusinessKey, op.State, op.Version, fromState, a.reason, a.actor)
	return nil
}
