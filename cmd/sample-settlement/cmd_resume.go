package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/workflow"
)

func init() {
	prog.Register("resume", "continue a failed or cancelled settlement run from its last checkpoint, audited", runResume)
}

func runResume(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := prog.NewFlagSet("resume", "resume [flags] RUN_KEY --reason TEXT --seen-version N", stderr)
	var db dbFlags
	db.register(fs)
	reason := fs.String("reason", "", "why the run can go on now, e.g. the incident fixed (required, kept in the audit trail)")
	actor := fs.String("actor", envOr("USER", ""), "who resumes the run, for the audit trail (default $USER)")
	seenVersion := fs.Int64("seen-version", 0, "the run's version you decided on, as the console's run page or \"stepwise runs show\" prints it (required); refused if the run has changed status since (resumed, run and failed again). Without it the command refuses and prints the version the run has now")
	// The run key may come before or after the flags.
	var key string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		key, args = args[0], args[1:]
	}
	if err := cmdline.ParseFlags(fs, args, true); err != nil {
		return err
	}
	if key == "" && fs.NArg() > 0 {
		key = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return cmdline.UsageError("unexpected argument %q after the run key", fs.Arg(0))
	}
	if key == "" {
		return cmdline.UsageError("RUN_KEY is required: the run's key, as \"report --date D\" lists it")
	}
	if *seenVersion < 0 {
		return cmdline.UsageError("--seen-version %d: want the version the console's run page shows (1 or more)", *seenVersion)
	}
	// The same checks as resolve's: a newline in --actor would forge a second audit line.
	if err := checkAuditFlags(*actor, *reason); err != nil {
		return err
	}
	pool, err := db.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	// An operator client (insert-only River): the resumed run's job is worked by the running
	// "serve" processes.
	client, err := stepwise.NewOperatorClient(pool)
	if err != nil {
		return err
	}
	if *seenVersion == 0 {
		// Guards against a resume on what the run is when the command runs rather than on
		// what the person saw: a run a colleague resumed, and that failed again for another
		// reason, would be resumed blindly. Say what the run is now; the person confirms it by
		// passing its version.
		run, err := client.RunGet(ctx, key)
		if err != nil {
			return err
		}
		if run.Status != workflow.RunStatusFailed && run.Status != workflow.RunStatusCancelled {
			return fmt.Errorf("%w: run %s is %s (version %d); only a failed or cancelled run can be resumed", workflow.ErrRunNotResumable, key, run.Status, run.Version)
		}
		return cmdline.UsageError("--seen-version is required: run %s is %s now (version %d%s); if that is the run you decided to resume, run the command again with --seen-version %d",
			key, run.Status, run.Version, lastErrorText(run.LastError), run.Version)
	}
	res, err := client.RunResume(ctx, key, &stepwise.RunResumeOpts{ExpectedVersion: *seenVersion, Actor: *actor, Reason: *reason})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "run %s resumed from its last checkpoint by %s (%q); serve picks it up\n", key, *actor, *reason)
	// Descendants that stopped after the run ended are news nobody decided on: say so.
	if left := res.LeftAsTheyAre; len(left) > 0 {
		fmt.Fprintf(stdout, "left as they are (failed or cancelled after the run ended; a parent waiting for them goes on without them: resume each on its own if that is the decision): %s\n", strings.Join(left, ", "))
	}
	return nil
}

// lastErrorText is ", last error \"...\"" for a run that has one.
func lastErrorText(e *string) string {
	if e == nil || *e == "" {
		return ""
	}
	return fmt.Sprintf(", last error %q", *e)
}
