package main

import (
	"context"
	"fmt"

	"github.com/stepwise-go/stepwise/migrations"
)

func runMigrate(ctx context.Context, c *cli, args []string) error {
	return group(ctx, c, args, "up", []command{
		{"up", "apply River's and Stepwise's migrations (the default; safe to run again, and from several processes)", migrateUp},
		{"status", "River's and Stepwise's schema versions: applied and known to this binary", migrateStatus},
	})
}

func migrateUp(ctx context.Context, c *cli, args []string) error {
	f := c.newFlags("[--database-url URL] [--json]", true, true)
	if _, err := f.parse(args, 0, 0, ""); err != nil {
		return err
	}
	// open refuses a database a newer binary migrated, before Migrate (which refuses it too).
	pool, before, err := f.open(ctx, true)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("database %s: %w", where(pool), err)
	}
	after, err := migrations.CheckNotNewer(ctx, pool)
	if err != nil {
		return err
	}
	if f.json {
		return c.printJSON(map[string]any{"database": where(pool), "before": schemaJSON(before), "after": schemaJSON(after)})
	}
	fmt.Fprintf(c.stdout, "migrated %s: Stepwise schema %d (was %d), River schema %d (was %d): up to date\n",
		where(pool), after.Stepwise, before.Stepwise, after.River, before.River)
	return nil
}

func migrateStatus(ctx context.Context, c *cli, args []string) error {
	f := c.newFlags("[--database-url URL] [--json]", true, true)
	if _, err := f.parse(args, 0, 0, ""); err != nil {
		return err
	}
	pool, st, err := f.open(ctx, true) // a newer schema is refused here, exit 1
	if err != nil {
		return err
	}
	defer pool.Close()
	if f.json {
		return c.printJSON(map[string]any{"database": where(pool), "schema": schemaJSON(st)})
	}
	c.table([]string{"SCHEMA", "APPLIED", "KNOWN TO THIS BINARY", "STATE"}, [][]string{
		{"stepwise", fmt.Sprint(st.Stepwise), fmt.Sprint(st.StepwiseKnown), state(st.Stepwise, st.StepwiseKnown)},
		{"river", fmt.Sprint(st.River), fmt.Sprint(st.RiverKnown), state(st.River, st.RiverKnown)},
	})
	if !st.Current() {
		fmt.Fprintln(c.stdout, "run \"stepwise migrate\" (or start your service, which migrates) to bring it up to date")
	}
	return nil
}

func state(applied, known int) string {
	if applied >= known {
		return "current"
	}
	return "behind: stepwise migrate"
}

func schemaJSON(st *migrations.SchemaState) map[string]any {
	return map[string]any{"stepwise": st.Stepwise, "stepwise_known": st.StepwiseKnown, "river": st.River, "river_known": st.RiverKnown, "current": st.Current()}
}
