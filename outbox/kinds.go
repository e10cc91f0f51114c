package outbox

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Register records this Outbox's kinds in the database (stepwise_outbox_kind), so that
// Enqueue accepts operations of them in every process. stepwise.Client.Start calls it; call it
// yourself when you wire an Outbox by hand (after Install, before the first Enqueue). It is
// idempotent, and a registration is never taken back. Install does not call it: Install has
// no context, and, like river.NewClient, it does not touch the database.
func (o *Outbox) Register(ctx context.Context) error {
	_, err := o.db.Exec(ctx, `
		INSERT INTO stepwise_outbox_kind (kind, registered_by)
		SELECT k, $2 FROM unnest($1::text[]) AS k
		ON CONFLICT (kind) DO NOTHING`, o.kindNames, o.actor)
	if err != nil {
		return fmt.Errorf("registering the outbox's kinds %v in stepwise_outbox_kind (has migrations.Migrate run on this database?): %w",
			o.kindNames, err)
	}
	return nil
}

// knownKinds caches, per database, the kinds found registered, so that Enqueue reads the
// registry only the first time it meets a kind (a registration is never taken back). A kind
// not found is never cached: it may be registered a moment later. It is process-wide because
// Enqueue has no Outbox to keep it in, only tx (see doc.go).
var knownKinds sync.Map // databaseKey(tx) + "\x00" + kind -> struct{}

// databaseKey names the database tx runs in, from its connection's configuration: one process
// may talk to several databases (tests do), and a kind registered in one is not in another.
func databaseKey(tx pgx.Tx) string {
	c := tx.Conn()
	if c == nil {
		return ""
	}
	cfg := c.Config()
	return cfg.Host + ":" + strconv.Itoa(int(cfg.Port)) + "/" + cfg.Database
}

// checkKinds refuses kinds no Outbox registered in tx's database. Without it an operation of
// a mistyped kind ("tickets" for "ticket") would commit and wait PENDING forever, silently.
func checkKinds(ctx context.Context, tx pgx.Tx, kinds []string) error {
	db := databaseKey(tx)
	var missing []string
	for _, k := range kinds {
		if _, ok := knownKinds.Load(db + "\x00" + k); !ok {
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
	for _, k := range registered {
		knownKinds.Store(db+"\x00"+k, struct{}{})
	}
	for _, k := range missing {
		if !slices.Contains(registered, k) {
			return fmt.Errorf("%w: %q: no outbox has registered it in this database, so nothing would ever send it; "+
				"registered kinds are %q. Check the spelling, or Start a stepwise.Client whose Config.Kinds has %q "+
				"(an Outbox wired by hand: call its Register) before enqueueing", ErrUnknownKind, k, registered, k)
		}
	}
	return nil
}
