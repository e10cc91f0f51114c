// Package cmdline is the sample's command-line frame: a table of subcommands, one
// cmd_<name>.go file each, dispatched with one exit-code contract. cmd/stepwise-lab runs on
// it too, so the lab's binary behaves as the sample's without a copy of its dispatcher.
//
// The contract of a subcommand's run function: it gets the arguments after the command name,
// parses them with its own flag.FlagSet (Program.NewFlagSet: flag.ContinueOnError, output to
// stderr, so --help works), writes its output to stdout and returns an error for a non-zero
// exit: flag.ErrHelp after --help exits 0, ErrUsage (wrapped, see UsageError) exits 2, any
// other error 1. ctx is cancelled on SIGINT or SIGTERM.
package cmdline

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

// RunFunc is a subcommand. See the package doc for its contract.
type RunFunc func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// Program is a binary made of subcommands.
type Program struct {
	// Name is the binary's name, in usage lines and messages.
	Name string
	// Footer is printed under the list of commands by help.
	Footer string
	// Width is the column the commands' summaries start at in help.
	Width int

	commands map[string]command
}

type command struct {
	summary string
	run     RunFunc
}

// Register adds a subcommand, from an init function; a duplicate name panics at start-up.
func (p *Program) Register(name, summary string, run RunFunc) {
	if _, dup := p.commands[name]; dup {
		panic(fmt.Sprintf("%s: command %q registered twice", p.Name, name))
	}
	if p.commands == nil {
		p.commands = map[string]command{}
	}
	p.commands[name] = command{summary: summary, run: run}
}

// Names returns the registered commands, sorted.
func (p *Program) Names() []string {
	names := make([]string, 0, len(p.commands))
	for name := range p.commands {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Main runs the command os.Args names, with a context cancelled on SIGINT or SIGTERM, and
// exits with its code.
func (p *Program) Main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := p.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Run dispatches to a command and maps its error to an exit code: 0 ok, 1 failure, 2 usage.
func (p *Program) Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		p.printUsage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	name := args[0]
	cmd, ok := p.commands[name]
	if !ok {
		fmt.Fprintf(stderr, "%s: unknown command %q; run \"%s help\" for the list\n", p.Name, name, p.Name)
		return 2
	}
	err := cmd.run(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		fmt.Fprintf(stderr, "%s %s: %s\n", p.Name, name, strings.TrimPrefix(err.Error(), ErrUsage.Error()+": "))
		return 2
	default:
		fmt.Fprintf(stderr, "%s %s: %v\n", p.Name, name, err)
		return 1
	}
}

func (p *Program) printUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: %s <command> [flags]   (%s <command> --help for its flags)\n", p.Name, p.Name)
	fmt.Fprintln(w, "\ncommands:")
	for _, name := range p.Names() {
		fmt.Fprintf(w, "  %-*s %s\n", p.Width, name, p.commands[name].summary)
	}
	fmt.Fprintf(w, "\n%s\n", p.Footer)
}

// NewFlagSet returns a FlagSet for a command whose usage lists its flags on stderr.
func (p *Program) NewFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s %s\n\nflags:\n", p.Name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// ErrUsage marks an error in the command line (an unknown flag, a malformed value): the
// process exits 2, as flag does.
var ErrUsage = errors.New("usage")

// UsageError wraps a command-line mistake; the message names the flag and the fix.
func UsageError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUsage, fmt.Sprintf(format, args...))
}

// ParseFlags parses args, mapping a flag error to ErrUsage (flag already printed it and the
// usage) and refusing stray arguments unless allowArgs.
func ParseFlags(fs *flag.FlagSet, args []string, allowArgs bool) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if !allowArgs && fs.NArg() > 0 {
		return UsageError("unexpected argument %q; flags go before arguments, see --help", fs.Arg(0))
	}
	return nil
}

// CheckInt refuses v outside lo..hi, naming the flag and the range.
func CheckInt(flagName string, v, lo, hi int) error {
	if v < lo || v > hi {
		return UsageError("--%s %d: want %d to %d", flagName, v, lo, hi)
	}
	return nil
}

// CheckDuration refuses d outside lo..hi, naming the flag and the range.
func CheckDuration(flagName string, d, lo, hi time.Duration) error {
	if d < lo || d > hi {
		return UsageError("--%s %s: want %s to %s", flagName, d, lo, hi)
	}
	return nil
}

// RedactURL returns u with its password replaced by "xxxxx", for logs and messages; a string
// that is not a URL is not shown at all.
func RedactURL(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return "(unparseable URL)"
	}
	if parsed.User != nil {
		if _, has := parsed.User.Password(); has {
			// Redacted keeps a user name; a password hidden in the query or a key=value DSN
			// is beyond it, so those are not shown at all.
			parsed.User = url.UserPassword(parsed.User.Username(), "xxxxx")
		}
	}
	if strings.Contains(strings.ToLower(parsed.RawQuery), "password") {
		parsed.RawQuery = "(redacted)"
	}
	return parsed.String()
}
