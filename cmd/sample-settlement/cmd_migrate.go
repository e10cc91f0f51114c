package main

import (
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"

	"context"
	"fmt"
	"io"
)

func init() {
	prog.Register("migrate", "bring River's, Stepwise's and the sample's tables up to date", runMigrate)
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := prog.NewFlagSet("migrate", "migrate [--database-url URL]", stderr)
	var db dbFlags
	db.register(fs)
	if err := cmdline.ParseFlags(fs, args, false); err != nil {
		return err
	}
	pool, err := db.connectMigrated(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	fmt.Fprintln(stdout, "migrated: River, Stepwise and the settlement tables are up to date")
	return nil
}
