package checkpoint_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/checkpoint"
)

// A zombie whose fenced write and COMMIT travel together commits nothing: the write finds the
// token moved on and raises, and the server skips the COMMIT queued behind it. Without the
// raise, the write would match no row, the COMMIT would land the zombie's business row, and
// this test would find it.
func TestAdvanceCommitRefusesZombie(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, b := setup(t, &checkpoint.Config{Lease: 50 * time.Millisecond, StallTimeout: time.Minute})
	_, err := b.pool.Exec(ctx, `CREATE TABLE business (who text)`)
	require.NoError(t, err)

	// claimAndWrite claims "k" for owner and begins a step that writes its business row.
	claimAndWrite := func(owner string) (*checkpoint.Lease, pgx.Tx) {
		l, err := s.Claim(ctx, "k", owner, 1)
		require.NoError(t, err)
		tx, err := s.Begin(ctx, l)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO business VALUES ($1)`, owner)
		require.NoError(t, err)
		return l, tx
	}
	zombie, ztx := claimAndWrite("zombie")

	// The zombie is paused past its lease; another owner claims and commits a step.
	time.Sleep(80 * time.Millisecond)
	next, ntx := claimAndWrite("next")
	require.NoError(t, s.AdvanceCommit(ctx, ntx, next, json.RawMessage(`{"by":"next"}`), nil))

	// The zombie wakes and sends its write and COMMIT together: refused, nothing lands.
	err = s.AdvanceCommit(ctx, ztx, zombie, json.RawMessage(`{"by":"zombie"}`), nil)
	require.ErrorIs(t, err, checkpoint.ErrFenced)
	require.Contains(t, err.Error(), `token 1`)
	require.NoError(t, ztx.Rollback(ctx), "the refused transaction is rolled back as any other")

	rows, err := b.pool.Query(ctx, `SELECT who FROM business ORDER BY who`)
	require.NoError(t, err)
	who, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"next"}, who, "only the current owner's step may land")

	st, err := s.Get(ctx, "k")
	require.NoError(t, err)
	require.JSONEq(t, `{"by":"next"}`, string(st.Cursor))
	require.Equal(t, int64(1), st.Steps)
	require.Equal(t, int64(1), next.Steps, "the owner's lease counts its step")
	require.Equal(t, int64(0), zombie.Steps, "the zombie's lease does not")

	// Both connections went back to the pool, idle and reusable (none was left inside a
	// transaction, or closed for it).
	stat := b.pool.Stat()
	require.Zero(t, stat.AcquiredConns())
	require.Zero(t, stat.CanceledAcquireCount())
}

// A step committed with AdvanceCommit is committed: its writes and cursor are visible to
// others, the connection goes back to the pool open and idle, and a second commit or a
// rollback of the same transaction is refused without touching the connection (which by then
// belongs to someone else).
func TestAdvanceCommitCommitsAndReturnsTheConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, b := setup(t, nil)
	_, err := b.pool.Exec(ctx, `CREATE TABLE business (n int)`)
	require.NoError(t, err)
	before := b.pool.Stat().TotalConns()

	l, err := s.Claim(ctx, "k", "owner", 1)
	require.NoError(t, err)
	for i := range 3 {
		tx, err := s.Begin(ctx, l)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO business VALUES ($1)`, i)
		require.NoError(t, err)
		require.NoError(t, s.AdvanceCommit(ctx, tx, l, json.RawMessage(`{"n":`+string(rune('0'+i))+`}`), nil))
		// The transaction is over: nothing more may run on it, above all not on the
		// connection it handed back (now idle in the pool, or another step's).
		require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxClosed)
		require.ErrorIs(t, tx.Rollback(ctx), pgx.ErrTxClosed)
		_, err = tx.Exec(ctx, `INSERT INTO business VALUES (100)`)
		require.ErrorIs(t, err, pgx.ErrTxClosed)
		_, err = tx.Query(ctx, `INSERT INTO business VALUES (101)`)
		require.ErrorIs(t, err, pgx.ErrTxClosed)
		require.ErrorIs(t, tx.QueryRow(ctx, `INSERT INTO business VALUES (102) RETURNING n`).Scan(new(int)), pgx.ErrTxClosed)
		batch := &pgx.Batch{}
		batch.Queue(`INSERT INTO business VALUES (103)`)
		require.ErrorIs(t, tx.SendBatch(ctx, batch).Close(), pgx.ErrTxClosed)
		_, err = tx.Begin(ctx)
		require.ErrorIs(t, err, pgx.ErrTxClosed)
		require.Nil(t, tx.Conn(), "the connection is the pool's again")
	}

	var n int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM business`).Scan(&n))
	require.Equal(t, 3, n)
	st, err := s.Get(ctx, "k")
	require.NoError(t, err)
	require.JSONEq(t, `{"n":2}`, string(st.Cursor))
	require.Equal(t, int64(3), st.Steps)
	require.Equal(t, int64(3), l.Steps)

	stat := b.pool.Stat()
	require.Zero(t, stat.AcquiredConns())
	require.LessOrEqual(t, stat.TotalConns(), before+1, "steps reuse one connection; none was closed and replaced")
	var open int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&open))
	require.Zero(t, open, "a pooled connection must not be left inside the step's transaction")
	c, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	require.Equal(t, byte('I'), c.Conn().PgConn().TxStatus())
}
