// Command stepwise-lab is Stepwise's lab: the chaos suite (worker processes of the sample
// settlement service killed and frozen at random, then every invariant checked), the bench
// (Stepwise against the plain-pgx floor and River one-job-per-merchant) and the fake bank as
// a server. None of it is part of the service a team copies (cmd/sample-settlement); it runs
// that service, through its settlement package, against Stepwise's fake bank.
// "stepwise-lab help" lists the commands.
package main

import "github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"

// prog is the lab's table of subcommands, filled by prog.Register from init functions, one
// cmd_<name>.go file each, on the sample's command-line frame (package cmdline: its contract,
// exit codes and flag handling).
var prog = &cmdline.Program{Name: "stepwise-lab", Width: 13,
	Footer: "The service under test is cmd/sample-settlement's; chaos and bench use $DATABASE_URL's server (or find one like its demo)."}

func main() { prog.Main() }

// Bounds of numeric flags, as sample-settlement's: a value that would exhaust memory or the
// database is refused before anything runs.
const (
	maxMerchants = 10_000_000
	maxShards    = 1024
)
