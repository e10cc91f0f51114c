package testkit

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ExampleDB gives a runnable Example (which has no *testing.T) a fresh migrated database, the
// same way DB gives one to a test; call the returned function to drop it. It exits the
// process with a message if no database can be had, as an example cannot fail otherwise.
func ExampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	tb := &exampleTB{}
	// Sized for a stepwise.Client with a few River workers, which refuses pgxpool's default
	// (max(4, NumCPU) connections); pgxpool opens connections only when needed.
	cfg, err := pgxpool.ParseConfig(DBURL(tb))
	if err != nil {
		tb.Fatalf("parsing the database URL: %v", err)
	}
	cfg.MaxConns = exampleMaxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("opening pool: %v", err)
	}
	tb.Cleanup(pool.Close) // before the drop DBURL registered (cleanups run last-in first-out)
	return pool, tb.cleanup
}

// exampleMaxConns is the pool size ExampleDB gives.
const exampleMaxConns = 32

// exampleTB is the part of testing.TB that testkit uses, for code outside a test.
type exampleTB struct {
	testing.TB // nil: calling anything not implemented below panics, loudly
	cleanups   []func()
}

func (*exampleTB) Helper()      {}
func (*exampleTB) Name() string { return "Example" }
func (*exampleTB) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "testkit.ExampleDB: "+format+"\n", args...)
	os.Exit(1)
}
func (*exampleTB) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "testkit.ExampleDB: "+format+"\n", args...)
}
func (tb *exampleTB) Cleanup(f func()) { tb.cleanups = append(tb.cleanups, f) }

func (tb *exampleTB) cleanup() {
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
}
