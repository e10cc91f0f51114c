package main

import (
	"context"
	"fmt"
	"io"
	"sort"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
)

func init() {
	prog.Register("seed", "write merchants and one date's card transactions (deterministic)", runSeed)
}

// seedFlags are seed's flags, shared with demo.
type seedFlags struct {
	date         string
	merchants    int
	transactions int
	seed         uint64
	closed       float64
}

func (f *seedFlags) register(fs interface {
	StringVar(*string, string, string, string)
	IntVar(*int, string, int, string)
	Uint64Var(*uint64, string, uint64, string)
	Float64Var(*float64, string, float64, string)
}) {
	fs.StringVar(&f.date, "date", "2026-03-01", "business date of the transactions, YYYY-MM-DD")
	fs.IntVar(&f.merchants, "merchants", 10_000, "merchants (ids 1..N; existing ones are kept)")
	fs.IntVar(&f.transactions, "transactions", 100_000, "card transactions of the date")
	fs.Uint64Var(&f.seed, "seed", 1, "random seed: the same seed gives the same data")
	fs.Float64Var(&f.closed, "closed-accounts", 0.001, "share of merchants whose bank account is closed (their payouts are declined)")
}

func (f *seedFlags) config() (*settlement.SeedConfig, error) {
	date, err := parseDateFlag(f.date)
	if err != nil {
		return nil, err
	}
	if err := cmdline.CheckInt("merchants", f.merchants, 1, maxMerchants); err != nil {
		return nil, err
	}
	if err := cmdline.CheckInt("transactions", f.transactions, 0, maxTransactions); err != nil {
		return nil, err
	}
	if err := checkShare("closed-accounts", f.closed); err != nil {
		return nil, err
	}
	closed := f.closed
	if closed == 0 {
		closed = -1 // SeedConfig's "none"
	}
	return &settlement.SeedConfig{Date: date, Merchants: f.merchants, Transactions: f.transactions, Seed: f.seed, ClosedAccounts: closed}, nil
}

func runSeed(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := prog.NewFlagSet("seed", "seed [--date 2026-03-01] [--merchants N] [--transactions N] [--seed N]", stderr)
	var db dbFlags
	var sf seedFlags
	db.register(fs)
	sf.register(fs)
	if err := cmdline.ParseFlags(fs, args, false); err != nil {
		return err
	}
	cfg, err := sf.config()
	if err != nil {
		return err
	}
	pool, err := db.connectMigrated(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := settlement.Seed(ctx, pool, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "seeded %s: %d new merchants (of %d), %d transactions: %s\n",
		sf.date, res.MerchantsCreated, cfg.Merchants, res.Transactions, fmtTotals(res.Totals))
	return nil
}

func fmtTotals(totals map[string]int64) string {
	curs := make([]string, 0, len(totals))
	for c := range totals {
		curs = append(curs, c)
	}
	sort.Strings(curs)
	s := ""
	for i, c := range curs {
		if i > 0 {
			s += ", "
		}
		s += settlement.FormatMoney(totals[c], c)
	}
	return s
}
