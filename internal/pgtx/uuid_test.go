package pgtx_test

import (
	"context"
	"os"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/internal/pgtx"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) }

func someIDs(n int) []uuid.UUID {
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
	}
	return ids
}

// roundTrip sends ids as a uuid[] and reads them back, one row each, in order.
func roundTrip(ctx context.Context, pool *pgxpool.Pool, param any, dest func(*uuid.UUID) any) ([]uuid.UUID, error) {
	rows, err := pool.Query(ctx, `SELECT x FROM unnest($1::uuid[]) WITH ORDINALITY AS n(x, i) ORDER BY i`, param)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (uuid.UUID, error) {
		var id uuid.UUID
		return id, r.Scan(dest(&id))
	})
}

// The native forms carry the same ids as uuid.UUID's own (text) path, in both directions,
// and the server sees the same values: a byte order mistake would show as different text.
func TestUUIDsRoundTrip(t *testing.T) {
	ctx := context.Background()
	pool := testkit.EmptyDB(t)
	ids := someIDs(50)

	got, err := roundTrip(ctx, pool, pgtx.UUIDs(ids), func(id *uuid.UUID) any { return pgtx.UUIDDest(id) })
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ids) {
		t.Fatalf("read back %d ids, sent %d", len(got), len(ids))
	}
	for i := range ids {
		if got[i] != ids[i] {
			t.Fatalf("id %d: sent %s, read back %s", i, ids[i], got[i])
		}
	}
	var texts []string
	if err := pool.QueryRow(ctx, `SELECT array_agg(x::text ORDER BY i) FROM unnest($1::uuid[]) WITH ORDINALITY AS n(x, i)`,
		pgtx.UUIDs(ids)).Scan(&texts); err != nil {
		t.Fatal(err)
	}
	for i := range ids {
		if texts[i] != ids[i].String() {
			t.Fatalf("id %d: the server has %s, sent %s", i, texts[i], ids[i])
		}
	}

	// UUIDDest is for non-null columns: a NULL is an error, not a zero id taken for a real one.
	var id uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT NULL::uuid`).Scan(pgtx.UUIDDest(&id)); err == nil {
		t.Fatal("scanning NULL into UUIDDest succeeded; want an error")
	}
}

// BenchmarkUUIDArray compares a uuid[] of 100 ids sent and read back as uuid.UUID (pgx's
// driver.Valuer and sql.Scanner paths, through text) with the native forms.
func BenchmarkUUIDArray(b *testing.B) {
	ctx := context.Background()
	pool := testkit.EmptyDB(b)
	ids := someIDs(100)
	b.Run("uuid.UUID", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := roundTrip(ctx, pool, ids, func(id *uuid.UUID) any { return id }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("native", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := roundTrip(ctx, pool, pgtx.UUIDs(ids), func(id *uuid.UUID) any { return pgtx.UUIDDest(id) }); err != nil {
				b.Fatal(err)
			}
		}
	})
}
