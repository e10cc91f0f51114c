// Command sample-settlement is Stepwise's reference service: daily settlement of card
// transactions per merchant, double-entry ledger entries and a payout per settlement to a
// (fake) bank through the operation ledger, with a reconciler, a report and invariant checks.
// Run "sample-settlement demo" first; "sample-settlement help" lists the commands.
package main

import "github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"

// prog is the binary's table of subcommands, filled by prog.Register from init functions:
// each command lives in its own cmd_<name>.go file, under package cmdline's contract
// (cmd/stepwise-lab, the bench and the chaos suite, runs on the same frame).
var prog = &cmdline.Program{Name: "sample-settlement", Width: 11,
	Footer: "The database is $DATABASE_URL (or --database-url); demo finds or starts one itself."}

func main() { prog.Main() }
