package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
)

func init() {
	prog.Register("settle", "start (or find started) the settlement of one date, and work it until it is at rest", runSettle)
}

func runSettle(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := prog.NewFlagSet("settle", "settle --date YYYY-MM-DD [--work=false]", stderr)
	var db dbFlags
	var pf planFlags
	var bf bankFlags
	db.register(fs)
	pf.register(fs)
	bf.register(fs)
	date := fs.String("date", "", "business date to settle, YYYY-MM-DD (required)")
	work := fs.Bool("work", true, "work the runs in this process until the date is at rest (false: only start them, for serve processes)")
	timeout := fs.Duration("timeout", 10*time.Minute, "with --work, how long to wait for the date to come to rest")
	if err := cmdline.ParseFlags(fs, args, false); err != nil {
		return err
	}
	d, err := parseDateFlag(*date)
	if err != nil {
		return err
	}
	if err := cmdline.CheckDuration("timeout", *timeout, time.Second, 7*24*time.Hour); err != nil {
		return err
	}
	plan, err := pf.plan()
	if err != nil {
		return err
	}
	bank, err := bf.client(5 * time.Second)
	if err != nil {
		return err
	}
	pool, err := db.connectMigrated(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var seeded bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM card_txn WHERE business_date = $1)`, d).Scan(&seeded); err != nil {
		return fmt.Errorf("looking for transactions of %s: %w", *date, err)
	}
	if !seeded {
		fmt.Fprintf(stdout, "note: %s has no card transactions; its runs will settle nothing (seed it with \"seed --date %s\")\n", *date, *date)
	}
	svc, err := settlement.NewService(pool, &settlement.ServiceConfig{Bank: bank, Plan: plan, Logger: newLogger(stderr, false),
		PayoutsAtRestTimeout: settlement.PayoutsAtRestTimeoutDefault})
	if err != nil {
		return err
	}
	runs, created, err := svc.StartDate(ctx, d)
	if err != nil {
		return err
	}
	verb := "started"
	if !created {
		verb = "already started (resuming them)"
	}
	fmt.Fprintf(stdout, "%s: %d runs %s:\n", *date, len(runs), verb)
	for _, r := range runs {
		fmt.Fprintf(stdout, "  %s  %s\n", r.Key, r.Status)
	}
	if !*work {
		fmt.Fprintln(stdout, "not working them here (--work=false): serve processes will")
		return nil
	}
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	if err := svc.Start(runCtx); err != nil {
		return err
	}
	waitCtx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	p, waitErr := settlement.WaitAtRest(waitCtx, pool, plan, d, 500*time.Millisecond, nil)
	if err := svc.Stop(context.Background(), 20*time.Second); err != nil {
		return err
	}
	if waitErr != nil {
		if errors.Is(waitErr, context.DeadlineExceeded) {
			return fmt.Errorf("%s is not at rest after %s (runs %s, payouts %s); run settle again to resume, or look at \"report --date %s\"",
				*date, *timeout, counts(p.Runs), counts(p.Operations), *date)
		}
		return waitErr
	}
	rep, err := settlement.BuildReport(ctx, pool, bank, plan, d)
	if err != nil {
		return err
	}
	printReport(stdout, rep)
	return nil
}
