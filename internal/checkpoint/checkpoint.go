package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/internal/faultpoint"
	"github.com/stepwise-go/stepwise/internal/pgtx"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

// maxKeyLen is the longest key the stepwise_checkpoint table accepts.
const maxKeyLen = 255

// Config configures a Store.
type Config struct {
	// Lease is how long a claim or renewal keeps a key for its owner. A crashed owner's work
	// is taken over after about this long, so shorter means faster takeover and more renewal
	// traffic. Defaults to 30s.
	Lease time.Duration

	// LockTimeout bounds how long Claim waits for a row lock on the checkpoint row. A claim
	// must never queue behind a paused holder: past this, Claim reports the key as held.
	// Defaults to 250ms.
	LockTimeout time.Duration

	// StallTimeout is the idle_in_transaction_session_timeout set on every step transaction.
	// A worker that stalls inside a step (GC pause, SIGSTOP, lost network) has its transaction
	// killed by the server after this long, releasing the row locks its uncommitted writes
	// hold, so the next owner is not blocked behind a zombie. Defaults to Lease.
	StallTimeout time.Duration
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c *Config) WithDefaults() *Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Lease == 0 {
		out.Lease = 30 * time.Second
	}
	if out.LockTimeout == 0 {
		out.LockTimeout = 250 * time.Millisecond
	}
	if out.StallTimeout == 0 {
		out.StallTimeout = out.Lease
	}
	return &out
}

func (c *Config) validate() error {
	if c.Lease <= 0 {
		return fmt.Errorf("checkpoint.Config.Lease is %s; it must be positive (e.g. 30s)", c.Lease)
	}
	if c.Lease < 10*time.Millisecond {
		return fmt.Errorf("checkpoint.Config.Lease is %s; leases under 10ms cannot be renewed in time", c.Lease)
	}
	if c.LockTimeout <= 0 {
		return fmt.Errorf("checkpoint.Config.LockTimeout is %s; it must be positive", c.LockTimeout)
	}
	if c.StallTimeout < time.Millisecond {
		return fmt.Errorf("checkpoint.Config.StallTimeout is %s; it must be at least 1ms", c.StallTimeout)
	}
	return nil
}

// Store claims, renews, advances and releases checkpoints in stepwise_checkpoint.
type Store struct {
	pool *pgxpool.Pool
	cfg  *Config
	// beginQuery opens a step transaction and arms the stall timeout in the same round trip.
	beginQuery string
	// renewals is the connection leases are renewed on, outside the pool (see renewer).
	renewals *renewer
}

// New returns a Store on pool.
func New(pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("checkpoint.New: pool is nil; pass the *pgxpool.Pool that holds Stepwise's tables")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Store{
		pool:       pool,
		cfg:        cfg,
		beginQuery: fmt.Sprintf("BEGIN; SET LOCAL idle_in_transaction_session_timeout = %d", cfg.StallTimeout.Milliseconds()),
		renewals:   newRenewer(pool, cfg.Lease),
	}, nil
}

// Config returns the store's configuration with defaults applied.
func (s *Store) Config() Config { return *s.cfg }

// Pool returns the pool the store uses.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Lease is a claimed key: the fencing token that every later write must carry, and the
// cursor as last committed.
type Lease struct {
	Key   string
	Owner string
	Token int64
	// Cursor is the last committed cursor, raw JSON (nil when none was committed yet).
	Cursor json.RawMessage
	// Steps is how many steps have committed for the key.
	Steps int64
	// CursorVersion is the version of Cursor's shape, as committed with it (AdvanceOpts):
	// 1 for a cursor committed without one, and before any cursor was committed.
	CursorVersion int

	// confirmedAt is a local monotonic time such that the lease is known to run until at
	// least confirmedAt + Lease (set by the claim, and by each step's fenced write from what
	// it left of the lease); zero when unknown. Only a claim moves the token, and a claim
	// needs the lease to have lapsed (or been released by this owner), so within Lease of
	// confirmedAt the token is certainly still ours and Begin need not ask. stepBegan is when
	// Begin started the current step.
	confirmedAt time.Time
	stepBegan   time.Time
	// heartbeats is set while a Heartbeat renews this lease: Advance then leaves a lease with
	// more than half left alone (see Advance).
	heartbeats atomic.Bool
}

// ValidateKey checks a key before it reaches the database.
func ValidateKey(key string) error {
	if key == "" {
		return errors.New("key is empty; give every run a stable, non-empty key")
	}
	if n := utf8.RuneCountInString(key); n > maxKeyLen {
		return fmt.Errorf("key %.40q… is %d characters; keys are limited to %d", key, n, maxKeyLen)
	}
	return nil
}

// Ensure creates the checkpoint row for key if it does not exist, in q's transaction when q
// is one, so a run and its checkpoint appear together or not at all.
func Ensure(ctx context.Context, q stepwisetype.DBTX, key string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, `INSERT INTO stepwise_checkpoint (key) VALUES ($1) ON CONFLICT (key) DO NOTHING`, key); err != nil {
		return fmt.Errorf("creating checkpoint %q: %w", key, err)
	}
	return nil
}

// Claim takes the lease on key for owner if it is free or expired (protocol step 1). The
// token grows by one on every claim, so every write of a previous owner is now refused.
// Lease times come from the database clock: worker clocks may disagree, the database's
// now() is the one clock every owner shares.
//
// Claim runs under a short lock_timeout: if a paused worker's transaction holds the row, we
// report the key as held instead of queueing behind it.
func (s *Store) Claim(ctx context.Context, key, owner string, attempt int) (*Lease, error) {
	began := time.Now() // before the claim's transaction, so before the now() its lease counts from
	lockTimeout := fmt.Sprintf("BEGIN; SET LOCAL lock_timeout = %d", s.cfg.LockTimeout.Milliseconds())
	var lease *Lease
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{BeginQuery: lockTimeout}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			WITH claimed AS (
				UPDATE stepwise_checkpoint
				   SET owner = $2, fencing_token = fencing_token + 1,
				       lease_until = now() + $3 * interval '1 millisecond', updated_at = now()
				 WHERE key = $1 AND (owner IS NULL OR lease_until IS NULL OR lease_until < now())
				RETURNING key, fencing_token, cursor, steps, cursor_version
			), audit AS (
				INSERT INTO stepwise_event (subject, kind, actor, token, attempt)
				SELECT key, 'lease.claim', $2, fencing_token, $4 FROM claimed
			)
			SELECT fencing_token, cursor, steps, cursor_version FROM claimed`,
			key, owner, s.cfg.Lease.Milliseconds(), attempt)
		if err != nil {
			return err
		}
		l, err := pgx.CollectExactlyOneRow(rows, func(row pgx.CollectableRow) (*Lease, error) {
			l := &Lease{Key: key, Owner: owner}
			return l, row.Scan(&l.Token, &l.Cursor, &l.Steps, &l.CursorVersion)
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return s.heldError(ctx, tx, key)
		}
		lease = l
		return err
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
			return nil, &HeldError{Key: key, Owner: "(a transaction holding the row)", RetryIn: s.cfg.LockTimeout}
		}
		if isHeld(err) || errors.Is(err, ErrNotFound) {
			return nil, err
		}
		return nil, fmt.Errorf("claiming checkpoint %q: %w", key, err)
	}
	lease.confirmedAt = began
	return lease, nil
}

func (s *Store) heldError(ctx context.Context, tx pgx.Tx, key string) error {
	var (
		owner   *string
		retryMS float64
	)
	err := tx.QueryRow(ctx, `SELECT owner, greatest(extract(epoch FROM lease_until - now()) * 1000, 0)
		FROM stepwise_checkpoint WHERE key = $1`, key).Scan(&owner, &retryMS)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	if err != nil {
		return err
	}
	h := &HeldError{Key: key, RetryIn: time.Duration(retryMS * float64(time.Millisecond))}
	if owner != nil {
		h.Owner = *owner
	}
	return h
}

// Begin opens a step transaction for l (protocol step 2). In the same round trip as BEGIN it
// sets idle_in_transaction_session_timeout, so a worker frozen inside the step has its
// transaction killed by the server instead of holding locks until it wakes. It then checks,
// without locking the row, that l's token is still current, to skip work a zombie would
// lose anyway. The row is deliberately NOT locked here: a SIGSTOPped holder of that lock would
// block every takeover until it woke.
//
// The check is skipped while less than Lease/2 has passed since confirmedAt (the lease is
// known to run for at least Lease past it: claimed then, or so much left after a committed
// Advance), by this process's clock: nobody can have claimed it since,
// so the check could only pass, and in a loop of short steps it would cost a round trip per
// step (measured by the sample's bench: ~100µs of a 6ms step). A worker frozen between steps
// (GC pause, SIGSTOP) finds the window passed and checks. Skipping is never unsafe: the
// fenced write in Advance is what refuses a zombie; this check only saves it wasted work.
func (s *Store) Begin(ctx context.Context, l *Lease) (pgx.Tx, error) {
	began := time.Now()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("beginning step of %q: %w", l.Key, err)
	}
	inner, err := conn.Conn().BeginTx(ctx, pgx.TxOptions{BeginQuery: s.beginQuery})
	if err != nil {
		conn.Release()
		return nil, fmt.Errorf("beginning step of %q: %w", l.Key, err)
	}
	tx := &connTx{Tx: inner, conn: conn}
	l.stepBegan = began
	if !l.confirmedAt.IsZero() && time.Since(l.confirmedAt) < s.cfg.Lease/2 {
		return tx, nil
	}
	var current int64
	if err := tx.QueryRow(ctx, `SELECT fencing_token FROM stepwise_checkpoint WHERE key = $1`, l.Key).Scan(&current); err != nil {
		pgtx.Rollback(ctx, tx)
		return nil, fmt.Errorf("checking token of %q: %w", l.Key, err)
	}
	if current != l.Token {
		pgtx.Rollback(ctx, tx)
		return nil, fmt.Errorf("%w (key %q: ours %d, current %d)", ErrFenced, l.Key, l.Token, current)
	}
	return tx, nil
}

// AdvanceOpts are options for Advance.
type AdvanceOpts struct {
	// Release gives up the lease in the same commit (end of a slice, sleep, or done), so the
	// next attempt can claim at once instead of waiting for the lease to lapse.
	Release bool

	// CursorVersion is the version of the cursor's shape, stored with it so that a reader
	// knows which shape it holds (a rolling deploy runs old and new code side by side). 0
	// means 1, the version of every cursor written without one.
	CursorVersion int
}

// Advance is the fenced write at the end of a step: it stores cursor, counts the step and
// renews (or releases) the lease, only if l's token is still the key's current one.
//
// While a Heartbeat runs for l, it renews the lease only when less than half of it is left:
// the heartbeat renews it every third of a Lease (by default), so the step's write leaves
// lease_until alone, and the update changes no indexed column (lease_until is indexed for
// maintenance) and is a HOT update: no new index entries, less WAL, at every step. When the
// heartbeat falls behind, a commit with less than half left renews it. Guards against: a
// write per step into two indexes for a renewal that is almost never due (measured at B=1 by
// the bench's trace: the cursor UPDATE 145 µs against the hand-written loop's 98 µs, and the
// commit 63 µs longer). The cost: from this write to the commit (the row locked, so the
// heartbeat's renewal waits), what is left of the lease covers the step's tail: two thirds
// of a Lease or more while the heartbeat keeps up, half at worst, where a renewal here gave a
// whole one. Without a Heartbeat every commit renews the lease, so a caller that steps
// without one needs each step shorter than Lease, as before.
//
// The renewal is measured from the statement's clock (clock_timestamp), not from the
// transaction's start (now()), and never moves lease_until backwards: a step whose statements
// ran longer than the lease would otherwise commit a lease already in the past, and a healthy
// worker would be taken over (guards: "a commit never shortens the lease"). The
// caller commits tx afterwards; on ErrFenced it must roll back, so none of the step's
// writes land. Under READ COMMITTED this UPDATE re-reads the newest row version, so either it
// commits before a newer claim (and the claimer resumes from this cursor) or it sees the
// token moved and refuses.
func (s *Store) Advance(ctx context.Context, tx pgx.Tx, l *Lease, cursor json.RawMessage, opts *AdvanceOpts) error {
	release, version, keepAbove, err := s.advanceOpts(l, opts)
	if err != nil {
		return err
	}
	// left is what remains of the lease after the write, in ms by the statement's clock.
	var left float64
	err = tx.QueryRow(ctx, advanceSQL, advanceArgs(l, cursor, release, s.cfg.Lease, version, keepAbove)...).Scan(&left)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w (key %q, token %d)", ErrFenced, l.Key, l.Token)
	}
	if err != nil {
		return fmt.Errorf("advancing checkpoint %q: %w", l.Key, err)
	}
	s.advanced(l, cursor, version, release, left)
	return nil
}

// advanceSQL is Advance's fenced write ($1 key, $2 token, $3 cursor, $4 release, $5 lease ms,
// $6 cursor version, $7 keep-above ms); it returns what is left of the lease, in ms.
const advanceSQL = `
		UPDATE stepwise_checkpoint
		   SET cursor = $3, cursor_version = $6, steps = steps + 1, updated_at = now(),
		       owner       = CASE WHEN $4 THEN NULL ELSE owner END,
		       lease_until = CASE WHEN $4 THEN NULL
		                          WHEN lease_until >= clock_timestamp() + $7 * interval '1 millisecond' THEN lease_until
		                          ELSE greatest(lease_until, clock_timestamp() + $5 * interval '1 millisecond') END
		 WHERE key = $1 AND fencing_token = $2
		RETURNING coalesce(extract(epoch FROM lease_until - clock_timestamp()) * 1000, 0)::float8`

// advanceOrRaiseSQL is advanceSQL that raises instead of matching no row (stepwise_fenced,
// migration 017): the error aborts the transaction, so a COMMIT sent behind it cannot land.
// The write returns a non-null value for the row it matched, so the function is called only
// when it matched none.
const advanceOrRaiseSQL = `WITH advanced AS (` + advanceSQL + ` AS left_ms)
		SELECT coalesce((SELECT left_ms FROM advanced), stepwise_fenced($1, $2))`

// fencedCode is the SQLSTATE stepwise_fenced raises.
const fencedCode = "SWF01"

func advanceArgs(l *Lease, cursor json.RawMessage, release bool, lease time.Duration, version int, keepAbove time.Duration) []any {
	return []any{l.Key, l.Token, cursor, release, lease.Milliseconds(), version, keepAbove.Milliseconds()}
}

// advanceOpts reads opts: whether to release, the cursor version, and keepAbove: a lease with
// at least this much left is not renewed (without a heartbeat a whole Lease, which no lease
// has left by the time a step commits: always renewed).
func (s *Store) advanceOpts(l *Lease, opts *AdvanceOpts) (release bool, version int, keepAbove time.Duration, err error) {
	release = opts != nil && opts.Release
	version = opts.cursorVersion()
	if version < 1 {
		return false, 0, 0, fmt.Errorf("advancing checkpoint %q: AdvanceOpts.CursorVersion is %d; versions start at 1 (0 means 1)", l.Key, version)
	}
	keepAbove = s.cfg.Lease
	if l.heartbeats.Load() {
		keepAbove = s.cfg.Lease / 2
	}
	return release, version, keepAbove, nil
}

// advanced records in l a fenced write that matched, with left ms of lease after it.
func (s *Store) advanced(l *Lease, cursor json.RawMessage, version int, release bool, left float64) {
	l.Steps++
	l.Cursor = cursor
	l.CursorVersion = version
	// The lease runs for at least left from this statement's clock, which is after
	// stepBegan: it holds until stepBegan + left at the earliest, which confirmedAt + Lease
	// must not pass. Should the commit fail, the caller abandons the attempt; a released
	// lease may be claimed at once.
	l.confirmedAt = l.stepBegan.Add(time.Duration(left*float64(time.Millisecond)) - s.cfg.Lease)
	if release {
		l.confirmedAt = time.Time{}
	}
}

// AdvanceCommit is Advance followed by the COMMIT of tx, sent together in one round trip:
// the end of a step after which the step writes nothing more (protocol steps 4 and 5). It
// saves the round trip a separate COMMIT takes, about a twentieth of a step of one item on
// a local server, more where the database is further away.
//
// The write raises when l's token is no longer current (advanceOrRaiseSQL), which aborts the
// transaction, so the server skips the COMMIT queued behind it: a zombie's writes never
// land, as with Advance and a COMMIT sent after it. That error is ErrFenced, and tx is rolled
// back.
//
// Any other error leaves the outcome of the COMMIT to be found out: it may have landed with
// its answer lost. The caller reads the checkpoint (our token, with Steps+1 counted, means it
// landed) and, if it did, records the step with Landed. On success l is advanced as Advance
// advances it.
//
// tx must come from Begin; for another transaction this is Advance and then tx.Commit.
func (s *Store) AdvanceCommit(ctx context.Context, tx pgx.Tx, l *Lease, cursor json.RawMessage, opts *AdvanceOpts) error {
	t, ok := tx.(*connTx)
	if !ok {
		// Not from Begin: Advance, then the COMMIT on its own. A COMMIT that failed leaves l as
		// before the step, as the pipelined path does, so that the caller's check for a commit
		// that landed anyway looks for one more step, not two.
		before := l.progress()
		if err := s.Advance(ctx, tx, l, cursor, opts); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			l.restore(before)
			return err
		}
		return nil
	}
	if t.ended {
		return fmt.Errorf("advancing checkpoint %q: %w", l.Key, pgx.ErrTxClosed)
	}
	release, version, keepAbove, err := s.advanceOpts(l, opts)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	var left float64
	b.Queue(advanceOrRaiseSQL, advanceArgs(l, cursor, release, s.cfg.Lease, version, keepAbove)...).QueryRow(func(row pgx.Row) error {
		return row.Scan(&left)
	})
	var tag pgconn.CommandTag
	b.Queue("COMMIT").Exec(func(ct pgconn.CommandTag) error {
		tag = ct
		return nil
	})
	err = t.Tx.SendBatch(ctx, b).Close()
	if err == nil && tag.String() != "COMMIT" {
		// A transaction already aborted answers COMMIT with ROLLBACK (it cannot be, as the
		// write before it would have failed, but a COMMIT that did not commit is never taken
		// for one that did).
		err = fmt.Errorf("COMMIT answered %q: %w", tag.String(), pgx.ErrTxCommitRollback)
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == fencedCode {
			return fmt.Errorf("%w (key %q, token %d)", ErrFenced, l.Key, l.Token)
		}
		return fmt.Errorf("advancing and committing checkpoint %q: %w", l.Key, err)
	}
	// Committed: pgx's transaction still believes itself open (the COMMIT was not its own),
	// so the connection is handed back here, without the ROLLBACK a Rollback would send.
	t.end()
	// Fault point: the COMMIT landed and its answer is taken for an error, l not advanced,
	// as when the connection is cut while the answer is on its way.
	if err := faultpoint.Hit(faultpoint.CommitAnswerLost); err != nil {
		return fmt.Errorf("advancing and committing checkpoint %q: %w", l.Key, err)
	}
	s.advanced(l, cursor, version, release, left)
	return nil
}

// leaseProgress is what a step's commit changes in a Lease.
type leaseProgress struct {
	steps       int64
	cursor      json.RawMessage
	version     int
	confirmedAt time.Time
}

func (l *Lease) progress() leaseProgress {
	return leaseProgress{steps: l.Steps, cursor: l.Cursor, version: l.CursorVersion, confirmedAt: l.confirmedAt}
}

func (l *Lease) restore(p leaseProgress) {
	l.Steps, l.Cursor, l.CursorVersion, l.confirmedAt = p.steps, p.cursor, p.version, p.confirmedAt
}

// Landed records in l a step whose commit reported an error and was then found to have
// landed (our token still current, one more step counted): the next Begin checks the token
// again, as nothing is known of the lease.
func (l *Lease) Landed(cursor json.RawMessage, opts *AdvanceOpts) {
	l.Steps++
	l.Cursor = cursor
	l.CursorVersion = opts.cursorVersion()
	l.confirmedAt = time.Time{}
}

// cursorVersion is the version to store: 0 (or no opts) means 1.
func (o *AdvanceOpts) cursorVersion() int {
	if o == nil || o.CursorVersion == 0 {
		return 1
	}
	return o.CursorVersion
}

// connTx is a step's transaction on a pool connection that Begin acquired itself, rather than
// a pgxpool.Tx: after AdvanceCommit's COMMIT, pgx's transaction object still believes itself
// open, and a pgxpool.Tx would send a ROLLBACK (a round trip, and a warning in the server's
// log) before handing the connection back. Once ended, every method refuses with
// pgx.ErrTxClosed, as pgx's own transaction does after its Commit, and Conn returns nil.
// Guards against: a step that kept its Step.Tx and used it after returning, whose statement
// would otherwise run, unfenced, on a connection back in the pool, perhaps inside another
// step's transaction. (LargeObjects, which pgx builds on its own transaction, is the one
// method not guarded.)
type connTx struct {
	pgx.Tx
	conn  *pgxpool.Conn
	ended bool
}

func (t *connTx) Commit(ctx context.Context) error {
	if t.ended {
		return pgx.ErrTxClosed
	}
	err := t.Tx.Commit(ctx)
	t.end()
	return err
}

// Rollback rolls back, unless the server already ended the transaction (a COMMIT sent with
// AdvanceCommit that failed, say on a deferred constraint): a ROLLBACK then would only earn
// a warning.
func (t *connTx) Rollback(ctx context.Context) error {
	if t.ended {
		return pgx.ErrTxClosed
	}
	var err error
	if pc := t.Tx.Conn().PgConn(); pc.IsClosed() || pc.TxStatus() != 'I' {
		err = t.Tx.Rollback(ctx)
	}
	t.end()
	return err
}

// Conn is nil once the transaction ended: its connection belongs to the pool again.
func (t *connTx) Conn() *pgx.Conn {
	if t.ended {
		return nil
	}
	return t.Tx.Conn()
}

func (t *connTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.ended {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Begin(ctx)
}

func (t *connTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.ended {
		return 0, pgx.ErrTxClosed
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *connTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.ended {
		return closedBatch{}
	}
	return t.Tx.SendBatch(ctx, b)
}

func (t *connTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.ended {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *connTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.ended {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.Tx.Exec(ctx, sql, args...)
}

func (t *connTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.ended {
		return closedRows{}, pgx.ErrTxClosed
	}
	return t.Tx.Query(ctx, sql, args...)
}

func (t *connTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.ended {
		return closedRows{}
	}
	return t.Tx.QueryRow(ctx, sql, args...)
}

// closedRows are the rows, and the row, of a query on an ended connTx: no rows, and
// pgx.ErrTxClosed.
type closedRows struct{}

func (closedRows) Close()                                       {}
func (closedRows) Err() error                                   { return pgx.ErrTxClosed }
func (closedRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (closedRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (closedRows) Next() bool                                   { return false }
func (closedRows) Scan(...any) error                            { return pgx.ErrTxClosed }
func (closedRows) Values() ([]any, error)                       { return nil, pgx.ErrTxClosed }
func (closedRows) RawValues() [][]byte                          { return nil }
func (closedRows) Conn() *pgx.Conn                              { return nil }
func (closedRows) TypeMap() *pgtype.Map                         { return nil }

// closedBatch is the result of a batch sent on an ended connTx.
type closedBatch struct{}

func (closedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, pgx.ErrTxClosed }
func (closedBatch) Query() (pgx.Rows, error)         { return closedRows{}, pgx.ErrTxClosed }
func (closedBatch) QueryRow() pgx.Row                { return closedRows{} }
func (closedBatch) Close() error                     { return pgx.ErrTxClosed }
func (closedBatch) Tx() pgx.Tx                       { return nil }

// end hands the connection back to the pool (which closes it if a transaction is still open
// on it, as after a failed ROLLBACK).
func (t *connTx) end() {
	t.ended = true
	t.conn.Release()
}

// Renew extends l's lease (protocol step 3), fenced by its token and owner. Like Advance it
// counts from clock_timestamp and never shortens the lease. ErrFenced means
// the lease was lost: the caller must stop the step.
//
// It runs on the store's own connection, not the pool's (see renewer): a busy pool must not
// make a live owner look dead. That connection is one more per process while leases are
// held, beyond the pool's MaxConns.
func (s *Store) Renew(ctx context.Context, l *Lease) error {
	tag, err := s.renewals.exec(ctx, `
		UPDATE stepwise_checkpoint
		   SET lease_until = greatest(lease_until, clock_timestamp() + $4 * interval '1 millisecond')
		 WHERE key = $1 AND fencing_token = $2 AND owner = $3`,
		l.Key, l.Token, l.Owner, s.cfg.Lease.Milliseconds())
	if err != nil {
		return fmt.Errorf("renewing lease on %q: %w", l.Key, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w (key %q, token %d)", ErrFenced, l.Key, l.Token)
	}
	return nil
}

// Release gives up l's lease without committing a step, so another attempt can claim at
// once. It is fenced: releasing a lease someone else now holds does nothing.
func (s *Store) Release(ctx context.Context, l *Lease) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, err := s.ReleaseIn(ctx, s.pool, l)
	return err
}

// ReleaseIn is Release in q (a transaction, so that the release commits with what the caller
// records beside it), reporting whether l still held the lease: false means another owner
// holds the key now and nothing was released.
func (s *Store) ReleaseIn(ctx context.Context, q stepwisetype.DBTX, l *Lease) (bool, error) {
	var n int
	err := q.QueryRow(ctx, `
		WITH released AS (
			UPDATE stepwise_checkpoint SET owner = NULL, lease_until = NULL, updated_at = now()
			 WHERE key = $1 AND fencing_token = $2 AND owner = $3
			RETURNING key
		), audit AS (
			INSERT INTO stepwise_event (subject, kind, actor, token) SELECT key, 'lease.release', $3, $2 FROM released
		)
		SELECT count(*) FROM released`,
		l.Key, l.Token, l.Owner).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("releasing lease on %q: %w", l.Key, err)
	}
	return n > 0, nil
}

// Get reads the checkpoint of key.
func (s *Store) Get(ctx context.Context, key string) (*State, error) {
	st := &State{Key: key}
	err := s.pool.QueryRow(ctx, `SELECT cursor, owner, lease_until, fencing_token, steps, updated_at, cursor_version
		FROM stepwise_checkpoint WHERE key = $1`, key).
		Scan(&st.Cursor, &st.Owner, &st.LeaseUntil, &st.Token, &st.Steps, &st.UpdatedAt, &st.CursorVersion)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	if err != nil {
		return nil, fmt.Errorf("reading checkpoint %q: %w", key, err)
	}
	return st, nil
}

// State is a checkpoint row as stored.
type State struct {
	Key        string
	Cursor     json.RawMessage
	Owner      *string
	LeaseUntil *time.Time
	Token      int64
	Steps      int64
	UpdatedAt  time.Time
	// CursorVersion is the version of Cursor's shape (1 unless a writer said otherwise).
	CursorVersion int
}
