package migrations

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// SchemaState is what CheckNotNewer found: the versions in the database and the newest
// versions this binary knows, for Stepwise's schema and River's.
type SchemaState struct {
	Stepwise, StepwiseKnown int
	River, RiverKnown       int
}

// Current reports whether the database holds every migration this binary knows.
func (s *SchemaState) Current() bool {
	return s.Stepwise >= s.StepwiseKnown && s.River >= s.RiverKnown
}

// CheckNotNewer refuses, with ErrDatabaseNewer and the message Migrate gives, a database
// whose Stepwise or River schema is newer than this binary knows; a database not yet
// migrated (or older) is not an error here, and the returned state tells how far it is.
//
// Guards against: a binary of the previous release started (or a read-only command run)
// after a newer one migrated the database. Migrate refuses such a database, but a process
// that does not migrate (serve --migrate=false, report, resolve) would otherwise write or
// read rows whose meaning it does not know. River's own migrator applies what it lacks and
// says nothing of versions it does not know, hence River's check here too.
func CheckNotNewer(ctx context.Context, pool *pgxpool.Pool) (*SchemaState, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return nil, fmt.Errorf("creating River migrator: %w", err)
	}
	riverAll := migrator.AllVersions()
	st := &SchemaState{StepwiseKnown: all[len(all)-1].Version, RiverKnown: riverAll[len(riverAll)-1].Version}
	// A database never migrated has neither table, and that is version 0. The test and the
	// read are two statements on purpose: PostgreSQL resolves every relation a statement
	// names when it parses it, whatever a CASE around it would pick, so one statement that
	// names stepwise_migration fails on exactly the database it means to call version 0.
	var hasStepwise, hasRiver bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('stepwise_migration') IS NOT NULL, to_regclass('river_migration') IS NOT NULL`).
		Scan(&hasStepwise, &hasRiver); err != nil {
		return nil, fmt.Errorf("reading the schema versions: %w", err)
	}
	if hasStepwise {
		if err := pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM stepwise_migration`).Scan(&st.Stepwise); err != nil {
			return nil, fmt.Errorf("reading Stepwise's schema version: %w", err)
		}
	}
	if hasRiver {
		if err := pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM river_migration WHERE line = 'main'`).Scan(&st.River); err != nil {
			return nil, fmt.Errorf("reading River's schema version: %w", err)
		}
	}
	if st.Stepwise > st.StepwiseKnown {
		return st, fmt.Errorf("%w: database has version %d, this binary knows up to %d; deploy the newer binary",
			ErrDatabaseNewer, st.Stepwise, st.StepwiseKnown)
	}
	if st.River > st.RiverKnown {
		return st, fmt.Errorf("%w: database has River schema version %d, this binary's River knows up to %d; deploy the newer binary",
			ErrDatabaseNewer, st.River, st.RiverKnown)
	}
	return st, nil
}
