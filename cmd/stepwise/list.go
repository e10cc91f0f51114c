package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	sw "github.com/stepwise-go/stepwise"
)

// operator opens the database (see open) and an operator's client on it (an insert-only
// River client, no workers): every command reads and acts through the client, as the
// console does. Close the pool when done.
func (f *flags) operator(ctx context.Context) (*pgxpool.Pool, *sw.Client, error) {
	pool, _, err := f.open(ctx, false)
	if err != nil {
		return nil, nil, err
	}
	client, err := sw.NewOperatorClient(pool)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, client, nil
}

// limit adds --limit: at most def of the listed things unless asked, 1 to 1000.
func (f *flags) limit(def int, what string) *int {
	return f.Int("limit", def, fmt.Sprintf("at most this many %s (1 to 1000)", what))
}

// checkLimit refuses a --limit outside 1 to 1000 (before anything is read).
func checkLimit(path string, limit int) error {
	if limit < 1 || limit > 1000 {
		return usageError("%s: --limit %d: want 1 to 1000", path, limit)
	}
	return nil
}

// listing is what a list command prints: JSON for --json, else a table, or none for an
// empty list; a list as long as limit (0: no limit) ends with how to see more.
type listing struct {
	json   any
	none   string
	header []string
	rows   [][]string
	limit  int
	narrow string // "--status, --key-prefix": the flags that narrow the list
}

func (f *flags) print(l listing) error {
	c := f.c
	if f.json {
		return c.printJSON(l.json)
	}
	if len(l.rows) == 0 {
		fmt.Fprintln(c.stdout, l.none)
		return nil
	}
	c.table(l.header, l.rows)
	if l.limit > 0 && len(l.rows) == l.limit {
		fmt.Fprintf(c.stdout, "(first %d; narrow with %s or raise --limit)\n", l.limit, l.narrow)
	}
	return nil
}
