package settlement

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/migrations"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

//go:embed sql/schema.sql
var schemaSQL string

// schemaLockKey serializes ApplySchema across processes (three serve processes starting at
// once); it differs from the migrations package's lock.
const schemaLockKey = 0x5e771e5c4e3a

// SchemaID identifies the business schema's text: it changes whenever the schema does.
// Tests name their template databases after it, so a changed schema gets a new template
// instead of a stale clone.
func SchemaID() string {
	sum := sha256.Sum256([]byte(schemaSQL))
	return hex.EncodeToString(sum[:])[:10]
}

// Migrate brings River's and Stepwise's schema up (migrations.Migrate) and then applies the
// sample's business tables. Safe to run again and from several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := migrations.Migrate(ctx, pool); err != nil {
		return err
	}
	return ApplySchema(ctx, pool)
}

// ApplySchema creates the business tables (merchant, card_txn, settlement, ledger_entry,
// settlement_day, settlement_day_shard, settlement_day_currency) if they do not exist, and
// records the payout kind (RegisterPayoutKind), in one transaction under an advisory lock.
// The kind belongs to the schema: with it recorded, a settle step enqueues payouts on a
// database where no Service has started yet (stepwise.Client.Start records it too).
func ApplySchema(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(schemaLockKey)); err != nil {
			return fmt.Errorf("taking the schema lock: %w", err)
		}
		if _, err := tx.Exec(ctx, schemaSQL); err != nil {
			return fmt.Errorf("applying the settlement schema: %w", err)
		}
		return RegisterPayoutKind(ctx, tx)
	})
}

// SchemaApplied reports whether the business tables ApplySchema creates exist, for the
// commands that read them without migrating.
func SchemaApplied(ctx context.Context, db stepwisetype.DBTX) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, `SELECT to_regclass('merchant') IS NOT NULL AND to_regclass('card_txn') IS NOT NULL
		AND to_regclass('settlement') IS NOT NULL AND to_regclass('ledger_entry') IS NOT NULL
		AND to_regclass('settlement_day') IS NOT NULL AND to_regclass('settlement_day_shard') IS NOT NULL
		AND to_regclass('settlement_day_currency') IS NOT NULL AND to_regclass('payout_scheme') IS NOT NULL`).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("looking for the settlement tables: %w", err)
	}
	return ok, nil
}

// ParseDate parses a business date, YYYY-MM-DD, as midnight UTC. A date is a calendar day,
// not an instant; UTC only keeps time.Time from shifting it.
func ParseDate(s string) (time.Time, error) {
	d, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return time.Time{}, &DateError{Input: s, Err: err}
	}
	return d, nil
}
