// Command sample-settlement is Stepwise's reference service: daily settlement of card
// transactions per merchant, double-entry ledger entries and a payout per settlement to a
// (fake) bank through the operation ledger, with a reconciler, a report and invariant checks.
// Run "sample-settlement demo" first; "sample-settlement help" lists the commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand of the binary.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands is the registry of subcommands, filled by register from init functions: each
// command lives in its own cmd_<name>.go file (cmd/stepwise-lab, the bench and the chaos
// suite, keeps the same contract). The contract:
//
//   - func register(name, summary string, run func(ctx, args, stdout, stderr) error), called
//     from an init function; names are unique (a duplicate panics at start-up);
//   - run gets the arguments after the command name, parses them with its own
//     flag.FlagSet (flag.ContinueOnError, output to stderr, so --help works), writes its
//     output to stdout and returns an error for a non-zero exit; flag.ErrHelp after --help
//     exits 0, errUsage (wrapped) exits 2;
//   - ctx is cancelled on SIGINT or SIGTERM.
var commands = map[string]command{}

// register adds a subcommand. See commands.
func register(name, summary string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) error) {
	if _, dup := commands[name]; dup {
		panic(fmt.Sprintf("sample-settlement: command %q registered twice", name))
	}
	commands[name] = command{name: name, summary: summary, run: run}
}

// errUsage marks an error in the command line (an unknown flag, a malformed value): the
// process exits 2, as flag does.
var errUsage = errors.New("usage")

// usageError wraps a command-line mistake; the message names the flag and the fix.
func usageError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches to a command and maps its error to an exit code: 0 ok, 1 failure, 2 usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		printUsage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "sample-settlement: unknown command %q; run \"sample-settlement help\" for the list\n", args[0])
		return 2
	}
	err := cmd.run(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "sample-settlement %s: %s\n", cmd.name, trimUsage(err))
		return 2
	default:
		fmt.Fprintf(stderr, "sample-settlement %s: %v\n", cmd.name, err)
		return 1
	}
}

// trimUsage drops the "usage: " prefix errUsage adds; the message itself names the fix.
func trimUsage(err error) string {
	msg := err.Error()
	prefix := errUsage.Error() + ": "
	if len(msg) > len(prefix) && msg[:len(prefix)] == prefix {
		return msg[len(prefix):]
	}
	return msg
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: sample-settlement <command> [flags]   (sample-settlement <command> --help for its flags)")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(w, "  %-11s %s\n", name, commands[name].summary)
	}
	fmt.Fprintln(w, "\nThe database is $DATABASE_URL (or --database-url); demo finds or starts one itself.")
}

// newFlagSet returns a FlagSet for a command whose usage lists its flags on stderr.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: sample-settlement %s\n\nflags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args, mapping a flag error to errUsage (flag already printed it and the
// usage) and refusing stray arguments unless allowArgs.
func parseFlags(fs *flag.FlagSet, args []string, allowArgs bool) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if !allowArgs && fs.NArg() > 0 {
		return usageError("unexpected argument %q; flags go before arguments, see --help", fs.Arg(0))
	}
	return nil
}
