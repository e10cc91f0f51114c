package outbox

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/stepwisetype"
)

// Register records this Outbox's kinds in the database (RegisterKinds), so that Enqueue
// accepts operations of them in every process. stepwise.Client.Start calls it. Install does
// not: Install has no context, and, like river.NewClient, it does not touch the database.
func (o *Outbox) Register(ctx context.Context) error {
	return RegisterKinds(ctx, o.db, o.actor, o.kindNames...)
}

// RegisterKinds records kinds in stepwise_outbox_kind, as registered by actor, so that
// Enqueue accepts operations of them in every process. It is idempotent, and a registration is
// never taken back.
func RegisterKinds(ctx context.Context, db stepwisetype.DBTX, actor string, kinds ...string) error {
	for _, k := range kinds {
		if err := ValidateKind(k); err != nil {
			return err
		}
	}
	_, err := db.Exec(ctx, `
		INSERT INTO stepwise_outbox_kind (kind, registered_by)
		SELECT k, $2 FROM unnest($1::text[]) AS k
		ON CONFLICT (kind) DO NOTHING`, kinds, actor)
	if err != nil {
		return fmt.Errorf("registering the kinds %v in stepwise_outbox_kind (has migrations.Migrate run on this database?): %w",
			kinds, err)
	}
	return nil
}

// databaseKey names the database tx runs in, from its connection's configuration: a client's
// pool has one, but a caller may hand OperationEnqueueTx a transaction of another, and a kind
// registered in one database is not in another.
func databaseKey(tx pgx.Tx) string {
	c := tx.Conn()
	if c == nil {
		return ""
	}
	cfg := c.Config()
	return cfg.Host + ":" + strconv.Itoa(int(cfg.Port)) + "/" + cfg.Database
}

// checkKinds refuses kinds nobody registered in tx's database. Without it an operation of
// a mistyped kind ("tickets" for "ticket") would commit and wait PENDING forever, silently.
// The kinds found are remembered in l (the client's Local; nil: none, every call reads the
// registry).
func checkKinds(ctx context.Context, l *Local, tx pgx.Tx, kinds []string) error {
	db := databaseKey(tx)
	var missing []string
	for _, k := range kinds {
		if l == nil {
			missing = append(missing, k)
			continue
		}
		if _, ok := l.kinds.Load(db + "\x00" + k); !ok {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return nil // the common case: no statement at all
	}
	rows, err := tx.Query(ctx, `SELECT kind FROM stepwise_outbox_kind ORDER BY kind`)
	if err != nil {
		return fmt.Errorf("reading the registered operation kinds (has migrations.Migrate run on this database?): %w", err)
	}
	registered, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("reading the registered operation kinds: %w", err)
	}
	if l != nil {
		for _, k := range registered {
			l.kinds.Store(db+"\x00"+k, struct{}{})
		}
	}
	for _, k := range missing {
		if !slices.Contains(registered, k) {
			return fmt.Errorf("%w: %q: no client has registered it in this database, so nothing would ever send it; "+
				"registered kinds are %q. Check the spelling, or Start a stepwise.Client whose Config.Kinds has %q "+
				"(or call outbox.RegisterKinds) before enqueueing", ErrUnknownKind, k, registered, k)
		}
	}
	return nil
}
