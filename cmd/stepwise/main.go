// Command stepwise operates any Stepwise deployment from a terminal, without writing Go:
// migrate its database, list and inspect runs, operations and schedules, cancel and resume
// runs, resolve operations by hand, prune old history, and serve the console and River UI.
//
// Install it at the version of the SDK your service uses (the schema checks compare
// versions):
//
//	go install github.com/stepwise-go/stepwise/cmd/stepwise@v0.x.y
//
// The database is $DATABASE_URL or --database-url; a password in it is never printed.
// "stepwise help" lists the commands; each takes --help.
//
// Exit codes, for scripts:
//
//	0  done
//	1  failed or refused (the database said no, the run or operation moved since you looked,
//	   the schema is newer than this binary); nothing was changed by a refusal
//	2  usage error (an unknown flag, a missing or malformed value); nothing was read or changed
//	3  not found (no such run, operation, schedule or slot)
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/stepwise-go/stepwise/stepwisetype"
)

// Exit codes. See the package doc.
const (
	exitOK       = 0
	exitFailed   = 1
	exitUsage    = 2
	exitNotFound = 3
)

// errUsage marks a command-line mistake (exit 2); errNotFound a missing subject (exit 3).
var (
	errUsage    = errors.New("usage")
	errNotFound = errors.New("not found")
)

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

// command is a command or a group of subcommands.
type command struct {
	name, summary string
	run           func(ctx context.Context, c *cli, args []string) error
}

// cli is what every command writes to.
type cli struct {
	stdout, stderr io.Writer
	path           string // "stepwise runs show", for usage lines and messages
}

func commands() []command {
	return []command{
		{"migrate", "bring River's and Stepwise's tables up to date; \"migrate status\" shows the versions", runMigrate},
		{"runs", "list runs; show, cancel or resume one (audited)", runRuns},
		{"ops", "list operations (payouts, refunds, ...); show one; resolve one by hand (audited)", runOps},
		{"schedules", "list schedules; pause or resume one; list a schedule's slots with their batch status", runSchedules},
		{"prune", "delete old finished history: a dry run unless --apply", runPrune},
		{"console", "serve the operator's console and River UI", runConsole},
	}
}

// run dispatches and maps the error to an exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := &cli{stdout: stdout, stderr: stderr, path: "stepwise"}
	if len(args) == 0 || isHelp(args[0]) || args[0] == "help" {
		printUsage(stdout, "stepwise <command> [subcommand] [flags]", commands())
		fmt.Fprintln(stdout, "\nThe database is $DATABASE_URL (or --database-url). Output is a table; --json prints JSON for scripts.")
		fmt.Fprintln(stdout, "Exit codes: 0 done, 1 failed or refused (nothing changed), 2 usage error, 3 not found.")
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	return c.exit(dispatch(ctx, c, commands(), args))
}

// dispatch runs the command args[0] names from cmds.
func dispatch(ctx context.Context, c *cli, cmds []command, args []string) error {
	for _, cmd := range cmds {
		if cmd.name == args[0] {
			sub := &cli{stdout: c.stdout, stderr: c.stderr, path: c.path + " " + cmd.name}
			return cmd.run(ctx, sub, args[1:])
		}
	}
	names := make([]string, len(cmds))
	for i, cmd := range cmds {
		names[i] = cmd.name
	}
	return usageError("%s: unknown command %q; want one of %s (\"%s --help\" says what each does)", c.path, args[0], strings.Join(names, ", "), c.path)
}

// group runs a command made of subcommands; def is the subcommand for no name (or a flag
// first), "" for none.
func group(ctx context.Context, c *cli, args []string, def string, subs []command) error {
	if len(args) > 0 && isHelp(args[0]) || len(args) > 0 && args[0] == "help" {
		printUsage(c.stdout, c.path+" <subcommand> [flags]", subs)
		return flag.ErrHelp
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if def == "" {
			printUsage(c.stderr, c.path+" <subcommand> [flags]", subs)
			return usageError("%s needs a subcommand", c.path)
		}
		args = append([]string{def}, args...)
	}
	return dispatch(ctx, c, subs, args)
}

func isHelp(s string) bool { return s == "-h" || s == "--help" || s == "-help" }

func printUsage(w io.Writer, synopsis string, cmds []command) {
	fmt.Fprintf(w, "usage: %s\n\ncommands:\n", synopsis)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, cmd := range cmds {
		fmt.Fprintf(tw, "  %s\t%s\n", cmd.name, cmd.summary)
	}
	_ = tw.Flush()
}

// exit prints err and returns its exit code.
func (c *cli) exit(err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.Is(err, errUsage):
		fmt.Fprintf(c.stderr, "%s\n", strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
		return exitUsage
	case isNotFound(err):
		fmt.Fprintf(c.stderr, "stepwise: %v\n", err)
		return exitNotFound
	default:
		fmt.Fprintf(c.stderr, "stepwise: %v\n", err)
		return exitFailed
	}
}

func isNotFound(err error) bool {
	return errors.Is(err, errNotFound) || errors.Is(err, stepwisetype.ErrNotFound)
}

// flags is a leaf command's flag set with the flags every command has.
type flags struct {
	*flag.FlagSet
	c        *cli
	synopsis string
	dbURL    string
	json     bool
}

// newFlags returns the flag set of a leaf command; withDB adds --database-url, withJSON
// --json.
func (c *cli) newFlags(synopsis string, withDB, withJSON bool) *flags {
	f := &flags{FlagSet: flag.NewFlagSet(c.path, flag.ContinueOnError), c: c, synopsis: synopsis}
	f.SetOutput(c.stderr)
	f.Usage = func() {
		fmt.Fprintf(c.stderr, "usage: %s %s\n\nflags:\n", c.path, synopsis)
		f.PrintDefaults()
	}
	if withDB {
		f.dbURL = os.Getenv("DATABASE_URL")
		f.Var(secretURL{&f.dbURL}, "database-url", "PostgreSQL URL of the service's database (default $DATABASE_URL)")
	}
	if withJSON {
		f.BoolVar(&f.json, "json", false, "print JSON (for scripts) instead of a table")
	}
	return f
}

// parse parses args, flags and arguments in any order, and returns the arguments; it
// refuses more than maxArgs of them (and fewer than minArgs), naming them in argNames.
func (f *flags) parse(args []string, minArgs, maxArgs int, argNames string) ([]string, error) {
	var positional []string
	for {
		if err := f.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %s: %w (see --help)", errUsage, f.c.path, err)
		}
		if f.NArg() == 0 {
			break
		}
		positional = append(positional, f.Arg(0))
		args = f.Args()[1:]
	}
	switch {
	case len(positional) > maxArgs:
		return nil, usageError("%s: unexpected argument %q; usage: %s %s", f.c.path, positional[maxArgs], f.c.path, f.synopsis)
	case len(positional) < minArgs:
		return nil, usageError("%s: %s is required; usage: %s %s", f.c.path, argNames, f.c.path, f.synopsis)
	}
	return positional, nil
}

// table writes rows under a header, aligned.
func (c *cli) table(header []string, rows [][]string) {
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
}

// printJSON writes v as indented JSON.
func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
