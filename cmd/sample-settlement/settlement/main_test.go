package settlement_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) }

// testDate is the business date the seeded template holds.
var testDate = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

// testSeed is the small data set of the seeded template: big enough for several batches per
// shard, small enough to settle in well under a second.
var testSeed = settlement.SeedConfig{Date: testDate, Merchants: 600, Transactions: 6000, ClosedAccounts: 0.01, Seed: 7}

func schemaTag(prefix string) string { return prefix + settlement.SchemaID() }

// schemaDB is a fresh database with Stepwise's and the sample's schema and no data.
func schemaDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testkit.TemplateDB(t, schemaTag("sch_"), settlement.ApplySchema)
	if err := settlement.RegisterPayoutKind(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

// seededDBURL is a fresh database holding testSeed, cloned from a template seeded once.
func seededDBURL(t *testing.T) string {
	t.Helper()
	return testkit.TemplateDBURL(t, schemaTag("seed_"), func(ctx context.Context, pool *pgxpool.Pool) error {
		if err := settlement.ApplySchema(ctx, pool); err != nil {
			return err
		}
		_, err := settlement.Seed(ctx, pool, &testSeed)
		return err
	})
}

func seededDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(seededDBURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = settlement.PoolConnsFor(4) // stepwise.NewClient refuses a smaller pool
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := settlement.RegisterPayoutKind(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}
