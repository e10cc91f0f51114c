package settlement

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SeedConfig sizes the data set Seed writes. Everything Seed writes follows from it: the same
// config gives the same merchants and transactions, byte for byte, so a demo's totals can be
// asserted on.
type SeedConfig struct {
	// Date is the business date of the transactions. Required.
	Date time.Time

	// Merchants is how many merchants exist after seeding (ids 1 to Merchants). Merchants
	// that already exist are kept as they are.
	//
	// Defaults to 10,000.
	Merchants int

	// Transactions is how many card transactions Date gets, spread unevenly over the
	// merchants (a few big ones, a long tail), mostly in each merchant's own currency.
	//
	// Defaults to 100,000.
	Transactions int

	// Currencies are the currencies merchants and transactions use, the first the most
	// common.
	//
	// Defaults to EUR, USD, GBP, JPY.
	Currencies []string

	// ClosedAccounts is the share of merchants whose bank account is closed, so that the
	// bank declines their payouts (PAYOUT_FAILED, with a reversing ledger entry).
	//
	// Defaults to 0.001. -1 means none.
	ClosedAccounts float64

	// Seed seeds the random source. Merchant i depends only on Seed and i, and a date's
	// transactions only on Seed and Date.
	//
	// Defaults to 1.
	Seed uint64
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c *SeedConfig) WithDefaults() *SeedConfig {
	out := SeedConfig{}
	if c != nil {
		out = *c
	}
	if out.Merchants == 0 {
		out.Merchants = 10_000
	}
	if out.Transactions == 0 {
		out.Transactions = 100_000
	}
	if len(out.Currencies) == 0 {
		out.Currencies = []string{"EUR", "USD", "GBP", "JPY"}
	}
	switch out.ClosedAccounts {
	case 0:
		out.ClosedAccounts = 0.001
	case -1:
		out.ClosedAccounts = 0
	}
	if out.Seed == 0 {
		out.Seed = 1
	}
	return &out
}

func (c *SeedConfig) validate() error {
	switch {
	case c.Date.IsZero():
		return errors.New("SeedConfig.Date is zero; set the business date to seed, e.g. settlement.ParseDate(\"2026-03-01\")")
	case c.Merchants < 1 || c.Merchants > 100_000_000:
		return fmt.Errorf("SeedConfig.Merchants is %d; want 1 to 100,000,000", c.Merchants)
	case c.Transactions < 0:
		return fmt.Errorf("SeedConfig.Transactions is %d; want 0 or more", c.Transactions)
	case c.ClosedAccounts < 0 || c.ClosedAccounts > 1:
		return fmt.Errorf("SeedConfig.ClosedAccounts is %v; want a share between 0 and 1 (-1 for none)", c.ClosedAccounts)
	}
	for _, cur := range c.Currencies {
		if len(cur) != 3 || cur[0] < 'A' || cur[0] > 'Z' || cur[1] < 'A' || cur[1] > 'Z' || cur[2] < 'A' || cur[2] > 'Z' {
			return fmt.Errorf("SeedConfig.Currencies: %q is not an ISO 4217 code such as \"EUR\"", cur)
		}
	}
	return nil
}

// SeedResult says what Seed wrote.
type SeedResult struct {
	// MerchantsCreated is how many merchants were new.
	MerchantsCreated int
	// Transactions is how many transactions the date got.
	Transactions int
	// Totals is the sum of the date's transactions per currency, in minor units.
	Totals map[string]int64
}

// seedLockKey serializes seeding, so two seeds of one date cannot both find it empty.
const seedLockKey = 0x5e771e5eed

// ShardHash is the hash of a merchant code that shards are derived from: 64-bit FNV-1a, as
// schedule.ShardOf computes, stored as the bits of a signed integer. merchant_shard(hash, n)
// in SQL equals schedule.ShardOf(code, n).
func ShardHash(code string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(code)) // never fails
	return int64(h.Sum64())      //nolint:gosec // the bits are what is stored
}

// MerchantCode is the business key of merchant id: "M" and at least six digits.
func MerchantCode(id int64) string { return fmt.Sprintf("M%06d", id) }

// Seed writes merchants 1 to cfg.Merchants (those missing) and cfg.Transactions card
// transactions for cfg.Date, then analyzes the tables so the settle step is planned with
// real statistics. A date that already has transactions is ErrAlreadySeeded.
func Seed(ctx context.Context, pool *pgxpool.Pool, cfg *SeedConfig) (*SeedResult, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	res := &SeedResult{Totals: map[string]int64{}}
	date := cfg.Date.UTC().Truncate(24 * time.Hour)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(seedLockKey)); err != nil {
			return fmt.Errorf("taking the seed lock: %w", err)
		}
		var seeded bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM card_txn WHERE business_date = $1)`, date).Scan(&seeded); err != nil {
			return fmt.Errorf("checking for transactions of %s: %w", date.Format(time.DateOnly), err)
		}
		if seeded {
			return fmt.Errorf("%w: %s already has card transactions; seed another --date, or use a fresh database",
				ErrAlreadySeeded, date.Format(time.DateOnly))
		}
		n, err := seedMerchants(ctx, tx, cfg)
		if err != nil {
			return err
		}
		res.MerchantsCreated = n
		// Statistics before the transactions go in: card_txn's foreign-key checks are
		// planned against merchant, and must see it as the big table it now is.
		if _, err := tx.Exec(ctx, `ANALYZE merchant`); err != nil {
			return fmt.Errorf("analyzing merchant: %w", err)
		}
		rows := genTransactions(cfg, date, res.Totals)
		copied, err := tx.CopyFrom(ctx, pgx.Identifier{"card_txn"},
			[]string{"merchant_id", "business_date", "type", "currency", "amount", "at"}, pgx.CopyFromRows(rows))
		if err != nil {
			return fmt.Errorf("copying %d transactions of %s: %w", len(rows), date.Format(time.DateOnly), err)
		}
		res.Transactions = int(copied)
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The settle step joins merchant and card_txn by the thousand; plan it with real
	// statistics rather than those of the empty tables it was created with.
	if _, err := pool.Exec(ctx, `ANALYZE merchant, card_txn, settlement, ledger_entry`); err != nil {
		return nil, fmt.Errorf("analyzing after seeding: %w", err)
	}
	return res, nil
}

func seedMerchants(ctx context.Context, tx pgx.Tx, cfg *SeedConfig) (int, error) {
	var have int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM merchant WHERE id <= $1`, cfg.Merchants).Scan(&have); err != nil {
		return 0, fmt.Errorf("counting merchants: %w", err)
	}
	if have == int64(cfg.Merchants) {
		return 0, nil
	}
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE merchant_seed (LIKE merchant INCLUDING DEFAULTS) ON COMMIT DROP`); err != nil {
		return 0, fmt.Errorf("creating the merchant staging table: %w", err)
	}
	rows := make([][]any, 0, cfg.Merchants)
	for id := int64(1); id <= int64(cfg.Merchants); id++ {
		m := genMerchant(cfg, id)
		rows = append(rows, []any{m.id, m.code, m.hash, m.name, m.account})
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"merchant_seed"},
		[]string{"id", "code", "shard_hash", "name", "bank_account"}, pgx.CopyFromRows(rows)); err != nil {
		return 0, fmt.Errorf("copying %d merchants: %w", len(rows), err)
	}
	tag, err := tx.Exec(ctx, `INSERT INTO merchant (id, code, shard_hash, name, bank_account)
		SELECT id, code, shard_hash, name, bank_account FROM merchant_seed ORDER BY id
		ON CONFLICT DO NOTHING`)
	if err != nil {
		return 0, fmt.Errorf("inserting merchants: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

type merchantRow struct {
	id      int64
	code    string
	hash    int64
	name    string
	account string
	// currency is the index of the merchant's own currency in SeedConfig.Currencies.
	currency int
}

var nameParts = [2][]string{
	{"Blue", "Corner", "North", "Golden", "Harbor", "Maple", "River", "Silver", "Urban", "Village", "Summit", "Olive"},
	{"Bakery", "Books", "Cafe", "Cycles", "Florist", "Grocer", "Hardware", "Kitchen", "Optics", "Pharmacy", "Studio", "Travel"},
}

// genMerchant derives merchant id from the seed and id alone, so growing the merchant count
// later leaves existing merchants as they were.
func genMerchant(cfg *SeedConfig, id int64) merchantRow {
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(id))) //nolint:gosec // test data, not secrets
	code := MerchantCode(id)
	m := merchantRow{id: id, code: code, hash: ShardHash(code)}
	m.name = nameParts[0][rng.IntN(len(nameParts[0]))] + " " + nameParts[1][rng.IntN(len(nameParts[1]))] + " " + code[1:]
	m.currency = pickCurrency(rng, len(cfg.Currencies))
	m.account = fmt.Sprintf("%s%02d-%010d", cfg.Currencies[m.currency][:2], rng.IntN(100), rng.Int64N(10_000_000_000))
	if rng.Float64() < cfg.ClosedAccounts {
		m.account = "closed-" + m.account
	}
	return m
}

// pickCurrency favours the first currencies: with four, about 50%, 27%, 15%, 8%.
func pickCurrency(rng *rand.Rand, n int) int {
	for i := 0; i < n-1; i++ {
		if rng.Float64() < 0.5+0.05*float64(i) {
			return i
		}
	}
	return n - 1
}

// genTransactions builds the date's transactions and adds them to totals. Merchants are
// drawn unevenly (half the volume goes to the first few percent), which makes some
// settlement batches heavier than others, as in life.
func genTransactions(cfg *SeedConfig, date time.Time, totals map[string]int64) [][]any {
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(date.Unix()))) //nolint:gosec // test data
	merchants := make([]merchantRow, cfg.Merchants)
	for i := range merchants {
		merchants[i] = genMerchant(cfg, int64(i+1))
	}
	lo, hi := math.Log(199), math.Log(25_000)
	rows := make([][]any, 0, cfg.Transactions)
	for range cfg.Transactions {
		var i int
		if rng.IntN(2) == 0 {
			i = rng.IntN(cfg.Merchants)
		} else {
			u := rng.Float64()
			i = int(float64(cfg.Merchants) * u * u * u)
		}
		m := merchants[i]
		cur := cfg.Currencies[m.currency]
		if len(cfg.Currencies) > 1 && rng.Float64() < 0.08 {
			cur = cfg.Currencies[rng.IntN(len(cfg.Currencies))]
		}
		typ := "pos"
		if rng.Float64() < 0.35 {
			typ = "ecom"
		}
		amount := int64(math.Exp(lo + rng.Float64()*(hi-lo)))
		at := date.Add(time.Duration(rng.Int64N(int64(24 * time.Hour))))
		totals[cur] += amount
		rows = append(rows, []any{m.id, date, typ, cur, amount, at})
	}
	return rows
}
