package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/outbox"
)

func init() {
	prog.Register("resolve", "settle a MANUAL or UNKNOWN_EXTERNAL payout by hand, audited", runResolve)
}

func runResolve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := prog.NewFlagSet("resolve", "resolve [flags] OP_ID --to SUCCEEDED|FAILED_PERMANENT|RETRYABLE --reason TEXT --seen-version N [--from STATE]", stderr)
	var db dbFlags
	db.register(fs)
	to := fs.String("to", "", "the decision: SUCCEEDED, FAILED_PERMANENT or RETRYABLE (required)")
	from := fs.String("from", "", "the state you saw (MANUAL or UNKNOWN_EXTERNAL); refused if the payout has moved since. Default: its current state")
	seenVersion := fs.Int64("seen-version", 0, "the payout's version you decided on, as the console's operation page shows it; refused if it has changed state since, even back to the same state (required: without it the command refuses and prints the version the payout has now)")
	reason := fs.String("reason", "", "why, for the audit trail (required)")
	actor := fs.String("actor", envOr("USER", ""), "who decides, for the audit trail (default $USER)")
	// The operation id may come before or after the flags.
	var opArg string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		opArg, args = args[0], args[1:]
	}
	if err := cmdline.ParseFlags(fs, args, true); err != nil {
		return err
	}
	if opArg == "" && fs.NArg() > 0 {
		opArg = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return cmdline.UsageError("unexpected argument %q after the operation id", fs.Arg(0))
	}
	if opArg == "" {
		return cmdline.UsageError("OP_ID is required: the payout's operation id (a UUID), as \"report --date D --json\" lists")
	}
	id, err := uuid.Parse(opArg)
	if err != nil {
		return cmdline.UsageError("OP_ID %q: want an operation id (a UUID such as 6b1f0c9e-3d0a-5f43-9b52-7f8e0a7d2c11)", opArg)
	}
	toState := outbox.State(strings.ToUpper(*to))
	switch toState {
	case outbox.StateSucceeded, outbox.StateFailedPermanent, outbox.StateRetryable:
	case "":
		return cmdline.UsageError("--to is required: SUCCEEDED, FAILED_PERMANENT or RETRYABLE")
	default:
		return cmdline.UsageError("--to %q: want SUCCEEDED, FAILED_PERMANENT or RETRYABLE", *to)
	}
	fromState := outbox.State(strings.ToUpper(*from))
	switch fromState {
	case "", outbox.StateManual, outbox.StateUnknownExternal:
	default:
		return cmdline.UsageError("--from %q: only MANUAL and UNKNOWN_EXTERNAL payouts are resolved by hand", *from)
	}
	if *seenVersion < 0 {
		return cmdline.UsageError("--seen-version %d: want the version the console's operation page shows (1 or more)", *seenVersion)
	}
	if err := checkAuditFlags(*actor, *reason); err != nil {
		return err
	}
	pool, err := db.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The same wiring as serve's, so the payout's outcome callback (the settlement moves with
	// the payout) runs in the resolution's transaction. Nothing is sent or looked up here.
	svc, err := settlement.NewService(pool, &settlement.ServiceConfig{Bank: dialBank(defaultBankURL, time.Second), ID: "resolve/" + *actor})
	if err != nil {
		return err
	}
	if *seenVersion == 0 {
		// Guards against a decision on what the payout is when the command runs rather than
		// on what the person saw: MANUAL, resolved RETRYABLE by a colleague, resent and
		// MANUAL again for another reason looks the same by state. Say what it is now; the
		// person confirms it by passing its version. A payout that is not resolvable at all,
		// not in the --from state, or not there, is refused as such.
		cur, err := settlement.Resolvable(ctx, svc.Client, id, fromState)
		if err != nil {
			return err
		}
		return cmdline.UsageError("--seen-version is required: payout %s (%s, %s) is %s now (version %d); if that is the payout you decided on, run the command again with --seen-version %d",
			id, cur.BusinessKey, settlement.FormatMoney(cur.Amount, cur.Currency), cur.State, cur.Version, cur.Version)
	}
	op, err := settlement.Resolve(ctx, svc.Client, settlement.Resolution{OperationID: id, From: fromState, SeenVersion: *seenVersion, To: toState, Actor: *actor, Reason: *reason})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "payout %s (%s, %s) is now %s (version %d); settlement %s; audited as %q by %s\n",
		op.ID, op.BusinessKey, settlement.FormatMoney(op.Amount, op.Currency), op.State, op.Version, settlement.StatusFor(op.State), *reason, *actor)
	return nil
}
