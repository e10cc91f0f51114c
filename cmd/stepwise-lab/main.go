// Command stepwise-lab is Stepwise's lab: the chaos suite (worker processes of the sample
// settlement service killed and frozen at random, then every invariant checked), the bench
// (Stepwise against the plain-pgx floor and River one-job-per-merchant) and the fake bank as
// a server. None of it is part of the service a team copies (cmd/sample-settlement); it runs
// that service, through its settlement package, against Stepwise's fake bank.
// "stepwise-lab help" lists the commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"
)

// command is one subcommand of the binary.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands is the registry of subcommands, filled by register from init functions, one
// cmd_<name>.go file each. The contract is sample-settlement's: run parses its arguments with
// its own flag.FlagSet (flag.ContinueOnError, output to stderr), writes its output to stdout
// and returns an error for a non-zero exit; flag.ErrHelp exits 0, errUsage (wrapped) exits 2;
// ctx is cancelled on SIGINT or SIGTERM.
var commands = map[string]command{}

// register adds a subcommand; a duplicate name panics at start-up.
func register(name, summary string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) error) {
	if _, dup := commands[name]; dup {
		panic(fmt.Sprintf("stepwise-lab: command %q registered twice", name))
	}
	commands[name] = command{name: name, summary: summary, run: run}
}

// errUsage marks an error in the command line: the process exits 2, as flag does.
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
		fmt.Fprintf(stderr, "stepwise-lab: unknown command %q; run \"stepwise-lab help\" for the list\n", args[0])
		return 2
	}
	err := cmd.run(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "stepwise-lab %s: %s\n", cmd.name, strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
		return 2
	default:
		fmt.Fprintf(stderr, "stepwise-lab %s: %v\n", cmd.name, err)
		return 1
	}
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: stepwise-lab <command> [flags]   (stepwise-lab <command> --help for its flags)")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(w, "  %-13s %s\n", name, commands[name].summary)
	}
	fmt.Fprintln(w, "\nThe service under test is cmd/sample-settlement's; chaos and bench use $DATABASE_URL's server (or find one like its demo).")
}

// newFlagSet returns a FlagSet for a command whose usage lists its flags on stderr.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: stepwise-lab %s\n\nflags:\n", synopsis)
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

// Bounds of numeric flags, as sample-settlement's: a value that would exhaust memory or the
// database is refused before anything runs.
const (
	maxMerchants = 10_000_000
	maxShards    = 1024
)

// checkInt refuses v outside lo..hi, naming the flag and the range.
func checkInt(flagName string, v, lo, hi int) error {
	if v < lo || v > hi {
		return usageError("--%s %d: want %d to %d", flagName, v, lo, hi)
	}
	return nil
}

// checkDuration refuses d outside lo..hi, naming the flag and the range.
func checkDuration(flagName string, d, lo, hi time.Duration) error {
	if d < lo || d > hi {
		return usageError("--%s %s: want %s to %s", flagName, d, lo, hi)
	}
	return nil
}

// redactURL returns u with its password replaced by "xxxxx", for messages; a string that is
// not a URL is not shown at all.
func redactURL(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return "(unparseable URL)"
	}
	if parsed.User != nil {
		if _, has := parsed.User.Password(); has {
			parsed.User = url.UserPassword(parsed.User.Username(), "xxxxx")
		}
	}
	if strings.Contains(strings.ToLower(parsed.RawQuery), "password") {
		parsed.RawQuery = "(redacted)"
	}
	return parsed.String()
}
