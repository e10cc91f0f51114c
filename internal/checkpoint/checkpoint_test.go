package checkpoint_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/checkpoint"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

type testBundle struct {
	pool *pgxpool.Pool
}

func setup(t *testing.T, cfg *checkpoint.Config) (*checkpoint.Store, *testBundle) {
	t.Helper()
	pool := testkit.DB(t)
	s, err := checkpoint.New(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, checkpoint.Ensure(context.Background(), pool, "k"))
	return s, &testBundle{pool: pool}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := checkpoint.New(nil, nil)
	require.ErrorContains(t, err, "pool is nil")

	pool := testkit.DB(t)
	for _, tc := range []struct {
		cfg  checkpoint.Config
		want string
	}{
		{checkpoint.Config{Lease: -time.Second}, "Lease"},
		{checkpoint.Config{Lease: time.Millisecond}, "Lease"},
		{checkpoint.Config{LockTimeout: -1}, "LockTimeout"},
		{checkpoint.Config{StallTimeout: -1}, "StallTimeout"},
	} {
		_, err := checkpoint.New(pool, &tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
}

func TestValidateKey(t *testing.T) {
	t.Parallel()
	require.ErrorContains(t, checkpoint.ValidateKey(""), "empty")
	require.ErrorContains(t, checkpoint.ValidateKey(strings.Repeat("x", 256)), "limited to 255")
	require.NoError(t, checkpoint.ValidateKey(strings.Repeat("é", 255)))
}

func TestClaimAdvanceRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := setup(t, &checkpoint.Config{Lease: 10 * time.Second})

	l, err := s.Claim(ctx, "k", "a", 1)
	require.NoError(t, err)
	require.Equal(t, int64(1), l.Token)
	require.Nil(t, l.Cursor)

	// A second owner is refused while the lease is live, and told how long to wait.
	_, err = s.Claim(ctx, "k", "b", 1)
	var held *checkpoint.HeldError
	require.ErrorAs(t, err, &held)
	require.Equal(t, "a", held.Owner)
	require.Greater(t, held.RetryIn, 8*time.Second)

	tx, err := s.Begin(ctx, l)
	require.NoError(t, err)
	require.NoError(t, s.Advance(ctx, tx, l, json.RawMessage(`{"n":5}`), &checkpoint.AdvanceOpts{Release: true}))
	require.NoError(t, tx.Commit(ctx))

	// Released in the commit: the next owner claims at once and resumes from the cursor.
	l2, err := s.Claim(ctx, "k", "b", 1)
	require.NoError(t, err)
	require.Equal(t, int64(2), l2.Token)
	require.JSONEq(t, `{"n":5}`, string(l2.Cursor))
	require.Equal(t, int64(1), l2.Steps)
}

func TestZombieIsFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, b := setup(t, &checkpoint.Config{Lease: 50 * time.Millisecond, StallTimeout: time.Minute})

	zombie, err := s.Claim(ctx, "k", "zombie", 1)
	require.NoError(t, err)
	ztx, err := s.Begin(ctx, zombie)
	require.NoError(t, err)
	_, err = ztx.Exec(ctx, "CREATE TEMP TABLE scratch (n int)")
	require.NoError(t, err)

	// The zombie is slow inside its step (but not holding the checkpoint row: Begin does not
	// lock it), its lease lapses, another owner claims and commits.
	time.Sleep(80 * time.Millisecond)
	next, err := s.Claim(ctx, "k", "next", 1)
	require.NoError(t, err, "a claim must not wait behind the zombie's open transaction")
	ntx, err := s.Begin(ctx, next)
	require.NoError(t, err)
	require.NoError(t, s.Advance(ctx, ntx, next, json.RawMessage(`{"by":"next"}`), nil))
	require.NoError(t, ntx.Commit(ctx))

	// The zombie wakes and tries to commit: refused.
	err = s.Advance(ctx, ztx, zombie, json.RawMessage(`{"by":"zombie"}`), nil)
	require.ErrorIs(t, err, checkpoint.ErrFenced)
	require.NoError(t, ztx.Rollback(ctx))
	require.ErrorIs(t, s.Renew(ctx, zombie), checkpoint.ErrFenced)

	st, err := s.Get(ctx, "k")
	require.NoError(t, err)
	require.JSONEq(t, `{"by":"next"}`, string(st.Cursor))
	require.Equal(t, int64(2), st.Token)

	// Tokens in the audit trail strictly increase.
	rows, err := b.pool.Query(ctx, "SELECT token FROM stepwise_event WHERE subject = 'k' AND kind = 'lease.claim' ORDER BY id")
	require.NoError(t, err)
	tokens, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2}, tokens)
}

func TestBeginRefusesStaleToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// StallTimeout defaults to the lease: 20 ms would end Begin's own transaction on a loaded
	// machine before its token check ran (seen beside a CPU hog), which is not what this tests.
	s, _ := setup(t, &checkpoint.Config{Lease: 20 * time.Millisecond, StallTimeout: 10 * time.Second})
	old, err := s.Claim(ctx, "k", "old", 1)
	require.NoError(t, err)
	time.Sleep(40 * time.Millisecond)
	_, err = s.Claim(ctx, "k", "new", 1)
	require.NoError(t, err)
	_, err = s.Begin(ctx, old)
	require.ErrorIs(t, err, checkpoint.ErrFenced)
}

func TestStallTimeoutEndsFrozenTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := setup(t, &checkpoint.Config{Lease: time.Second, StallTimeout: 100 * time.Millisecond})
	l, err := s.Claim(ctx, "k", "a", 1)
	require.NoError(t, err)
	tx, err := s.Begin(ctx, l)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // frozen inside the step
	err = s.Advance(ctx, tx, l, json.RawMessage(`{}`), nil)
	require.Error(t, err, "the server must have ended the idle transaction")
	_ = tx.Rollback(ctx)
}

func TestRacingClaimsOneHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := setup(t, &checkpoint.Config{Lease: 200 * time.Millisecond})

	// 8 workers race for the key for a while; at every moment at most one holds it, proven
	// by an in-process counter that a holder raises while it believes it holds the lease.
	var (
		holders, maxHolders atomic.Int32
		claims              atomic.Int32
		wg                  sync.WaitGroup
	)
	deadline := time.Now().Add(1500 * time.Millisecond)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for time.Now().Before(deadline) {
				l, err := s.Claim(ctx, "k", "w"+string(rune('a'+i)), 1)
				if err != nil {
					assert.True(t, checkpoint.IsHeld(err), "%v", err)
					time.Sleep(5 * time.Millisecond)
					continue
				}
				claims.Add(1)
				n := holders.Add(1)
				for {
					m := maxHolders.Load()
					if n <= m || maxHolders.CompareAndSwap(m, n) {
						break
					}
				}
				time.Sleep(10 * time.Millisecond)
				holders.Add(-1)
				assert.NoError(t, s.Release(ctx, l))
			}
		}(i)
	}
	wg.Wait()
	require.Equal(t, int32(1), maxHolders.Load())
	require.Greater(t, claims.Load(), int32(10))
	st, err := s.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, int64(claims.Load()), st.Token, "every claim advanced the token by exactly one")
}

func TestHeartbeatKeepsLeaseAndReportsFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A lease long enough that a renewal (budget: Lease - interval) survives a loaded machine:
	// with 150ms it failed under a full parallel test run, and with 600ms once in a quiet CI
	// run of the whole suite (the heartbeat's first renewals also wait for its own
	// connection's dial); the test is about renewing and fencing, not about a short lease.
	s, b := setup(t, &checkpoint.Config{Lease: 2 * time.Second})
	l, err := s.Claim(ctx, "k", "a", 1)
	require.NoError(t, err)
	lost := make(chan error, 1)
	stop := s.Heartbeat(ctx, l, 0, func(err error) { lost <- err })
	time.Sleep(4500 * time.Millisecond) // well past the lease: the heartbeat kept it
	_, err = s.Claim(ctx, "k", "b", 1)
	require.True(t, checkpoint.IsHeld(err), "lease must still be held, got %v", err)

	// Someone steals the key (as a takeover after a long pause would): the heartbeat
	// reports the fence instead of renewing.
	_, err = b.pool.Exec(ctx, "UPDATE stepwise_checkpoint SET fencing_token = fencing_token + 1 WHERE key = 'k'")
	require.NoError(t, err)
	select {
	case err := <-lost:
		require.True(t, errors.Is(err, checkpoint.ErrFenced), "%v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("heartbeat did not report the lost lease")
	}
	stop()
}

// A step whose statements run longer than the lease must not commit a lease in the past: the
// renewal counts from the commit's clock, not from the transaction's start.
// On the old code every such step left an expired lease on a healthy worker.
func TestLongStatementNeverLeavesLeaseInPast(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	s, b := setup(t, &checkpoint.Config{Lease: lease})
	ctx := context.Background()
	l, err := s.Claim(ctx, "k", "w1", 1)
	require.NoError(t, err)
	for i := range 2 {
		tx, err := s.Begin(ctx, l)
		require.NoError(t, err)
		// A statement longer than the lease; a heartbeat renews meanwhile, as a worker's would.
		_, err = tx.Exec(ctx, `SELECT pg_sleep(1.3)`)
		require.NoError(t, err)
		require.NoError(t, s.Renew(ctx, l))
		var renewed time.Time
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT lease_until FROM stepwise_checkpoint WHERE key = 'k'`).Scan(&renewed))
		require.NoError(t, s.Advance(ctx, tx, l, json.RawMessage(`{}`), nil))
		require.NoError(t, tx.Commit(ctx))
		var committed time.Time
		var left time.Duration
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT lease_until, (extract(epoch FROM lease_until - clock_timestamp()) * 1e9)::bigint
			FROM stepwise_checkpoint WHERE key = 'k'`).Scan(&committed, &left))
		t.Logf("step %d: lease left after commit %s; lease_until moved %s by the commit (lease %s)", i+1, left.Round(time.Millisecond), committed.Sub(renewed), lease)
		require.Greater(t, left, time.Duration(0), "the commit left the lease in the past")
		require.False(t, committed.Before(renewed), "the commit shortened the lease the heartbeat had just renewed")
	}
}

// A worker whose pool is busy (every connection held by step transactions, sends, River's own
// work) is alive and connected: its heartbeat must still renew its leases. On the old code the
// heartbeat took its connection from that pool, waited behind the busy connections past the
// lease, and the healthy worker's runs were taken over (the classic chaos profile, where eight
// settle runs and the payout sends shared pgx's default of four connections).
func TestHeartbeatRenewsWhilePoolIsBusy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// 2 s, not less: the property is that renewals do not wait for the pool; with a 600 ms
	// lease a process starved of CPU beside a hog (renewing every lease/3) missed it by 20 ms
	// with the pool not involved at all.
	const lease = 2 * time.Second
	url := testkit.DBURL(t)
	pcfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	observer, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(observer.Close)
	require.NoError(t, checkpoint.Ensure(ctx, pool, "k"))
	s, err := checkpoint.New(pool, &checkpoint.Config{Lease: lease})
	require.NoError(t, err)

	l, err := s.Claim(ctx, "k", "a", 1)
	require.NoError(t, err)
	lost := make(chan error, 1)
	stop := s.Heartbeat(ctx, l, 0, func(err error) { lost <- err })
	defer stop()

	// Every connection of the pool is busy for four leases, as in a process whose other
	// steps and sends hold them.
	var held []*pgxpool.Conn
	release := func() {
		for _, c := range held {
			c.Release()
		}
		held = nil
	}
	defer release() // pool.Close at cleanup waits for every acquired connection
	for range pcfg.MaxConns {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, c)
	}
	busyUntil := time.Now().Add(4 * lease)
	for time.Now().Before(busyUntil) {
		var left time.Duration
		require.NoError(t, observer.QueryRow(ctx, `SELECT (extract(epoch FROM lease_until - clock_timestamp()) * 1e9)::bigint
			FROM stepwise_checkpoint WHERE key = 'k'`).Scan(&left))
		require.Greater(t, left, time.Duration(0), "the lease of a live, connected owner lapsed while its pool was busy")
		select {
		case err := <-lost:
			t.Fatalf("the heartbeat gave the lease up while its pool was busy: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	release()
	_, err = s.Claim(ctx, "k", "b", 1)
	require.True(t, checkpoint.IsHeld(err), "lease must still be held, got %v", err)
}

// The renewals' own connection is replaced when it dies while idle (a server restart, a
// failover, an idle-session timeout): the next renewal reconnects instead of failing, so
// one dead connection never costs a live owner its lease.
func TestRenewReconnectsAfterItsConnectionDied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, b := setup(t, &checkpoint.Config{Lease: 10 * time.Second})
	l, err := s.Claim(ctx, "k", "a", 1)
	require.NoError(t, err)
	require.NoError(t, s.Renew(ctx, l))
	var killed int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'stepwise lease renewal'`).Scan(&killed))
	require.Equal(t, 1, killed, "the renewal ran on a connection of its own, outside the pool")
	require.NoError(t, s.Renew(ctx, l), "the renewal after its connection died must reconnect")
	_, err = s.Claim(ctx, "k", "b", 1)
	require.True(t, checkpoint.IsHeld(err), "lease must still be held, got %v", err)
}

// A renewal does not wait for its own connection to open. A server starved of CPU forks its
// backends slowly (connecting took seconds beside a CPU hog); a live owner whose pool has
// connections open must keep its lease meanwhile. On the old code the first renewal of a
// process spent its whole budget connecting, gave up without trying the pool, and the owner
// lost its lease: a worker of the long chaos profile committing other runs' steps had a run
// taken over (issue 21).
func TestHeartbeatKeepsLeaseWhileItsConnectionOpensSlowly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const lease = time.Second
	proxy, url := testkit.NewProxy(t, testkit.DBURL(t))
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := checkpoint.New(pool, &checkpoint.Config{Lease: lease})
	require.NoError(t, err)
	require.NoError(t, checkpoint.Ensure(ctx, pool, "k"))
	l, err := s.Claim(ctx, "k", "a", 1) // the pool's connection is open now
	require.NoError(t, err)

	proxy.DelayConnects(3 * lease)
	lost := make(chan error, 1)
	stop := s.Heartbeat(ctx, l, 0, func(err error) { lost <- err })
	defer stop()
	select {
	case err := <-lost:
		t.Fatalf("a live owner whose pool is open lost its lease while a connection opened: %v", err)
	case <-time.After(5 * lease / 2):
	}
	_, err = s.Claim(ctx, "k", "b", 1)
	require.True(t, checkpoint.IsHeld(err), "lease must still be held, got %v", err)
}

// While a heartbeat keeps the lease (more than half of it left), a step's fenced write
// leaves lease_until alone, so the update touches no indexed column and is HOT: no index
// entries per step. With less than half left (the heartbeat behind), the write renews it;
// without a heartbeat, every write does. Red before: every Advance renewed, and no step's
// update was HOT.
func TestAdvanceRenewsOnlyWhenHalfTheLeaseIsGone(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	s, b := setup(t, &checkpoint.Config{Lease: lease})
	ctx := context.Background()
	require.NoError(t, checkpoint.Ensure(ctx, b.pool, "nohb"))
	l, err := s.Claim(ctx, "nohb", "w1", 1)
	require.NoError(t, err)
	// Without a heartbeat: renewed at every commit, as before (a caller stepping without one
	// keeps its lease with steps shorter than Lease).
	for i := range 2 {
		tx, err := s.Begin(ctx, l)
		require.NoError(t, err)
		var before, after time.Time
		require.NoError(t, tx.QueryRow(ctx, `SELECT lease_until FROM stepwise_checkpoint WHERE key = 'nohb'`).Scan(&before))
		require.NoError(t, s.Advance(ctx, tx, l, json.RawMessage(`{}`), nil))
		require.NoError(t, tx.QueryRow(ctx, `SELECT lease_until FROM stepwise_checkpoint WHERE key = 'nohb'`).Scan(&after))
		require.NoError(t, tx.Commit(ctx))
		require.True(t, after.After(before), "step %d without a heartbeat did not renew the lease", i)
	}

	l, err = s.Claim(ctx, "k", "w1", 1)
	require.NoError(t, err)
	checkpoint.MarkHeartbeatingForTest(l)
	step := func() (hot int, before, after time.Time) {
		tx, err := s.Begin(ctx, l)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		// The backend's HOT count before and after, on the step's own connection (the count
		// may include the connection's earlier transactions not yet flushed: the difference).
		var hot0 int
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_hot_updated('stepwise_checkpoint'::regclass)::int, lease_until
			FROM stepwise_checkpoint WHERE key = 'k'`).Scan(&hot0, &before))
		require.NoError(t, s.Advance(ctx, tx, l, json.RawMessage(`{}`), nil))
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_hot_updated('stepwise_checkpoint'::regclass)::int, lease_until
			FROM stepwise_checkpoint WHERE key = 'k'`).Scan(&hot, &after))
		hot -= hot0
		require.NoError(t, tx.Commit(ctx))
		return hot, before, after
	}
	for i := range 3 {
		hot, before, after := step()
		require.Equal(t, before, after, "step %d: the write moved a lease that had more than half left", i)
		require.Equal(t, 1, hot, "step %d: the step's update was not HOT", i)
	}
	// The heartbeat is behind: less than half the lease is left at the next step.
	time.Sleep(lease/2 + 200*time.Millisecond)
	hot, before, after := step()
	require.Greater(t, after.Sub(before), lease/2, "a step with less than half the lease left did not renew it")
	require.Zero(t, hot, "the renewing write changed lease_until, an indexed column: not HOT")
}

// Begin skips its token check only while the lease is known to run for more than Lease/2
// more: after a step's write that did not renew (a heartbeat renews instead), that is
// measured from what the write left, not from the step's start. Here the lease is taken from
// under the holder behind the protocol's back once the skip must have ended: Begin has to
// see it. Red with the skip dated from the step's start (as when every write renewed).
func TestBeginChecksOnceHalfTheLeaseLeftIsGone(t *testing.T) {
	t.Parallel()
	const lease = 8 * time.Second
	s, b := setup(t, &checkpoint.Config{Lease: lease})
	ctx := context.Background()
	l, err := s.Claim(ctx, "k", "w1", 1)
	require.NoError(t, err)
	checkpoint.MarkHeartbeatingForTest(l)
	time.Sleep(1600 * time.Millisecond)
	stepBegan := time.Now()
	tx, err := s.Begin(ctx, l)
	require.NoError(t, err)
	require.NoError(t, s.Advance(ctx, tx, l, json.RawMessage(`{}`), nil)) // about 6.4 s left: not renewed
	require.NoError(t, tx.Commit(ctx))
	// The lease runs until about claim + 8 s, so the skip ends by claim + 4 s, 2.4 s after
	// the step began (dated from the step's start it would end 4 s after it). Someone else
	// takes the key (as after a lapse).
	_, err = b.pool.Exec(ctx, `UPDATE stepwise_checkpoint SET lease_until = now() - interval '1 second' WHERE key = 'k'`)
	require.NoError(t, err)
	_, err = s.Claim(ctx, "k", "w2", 1)
	require.NoError(t, err)
	time.Sleep(time.Until(stepBegan.Add(2800 * time.Millisecond)))
	stale, err := s.Begin(ctx, l)
	if err == nil {
		_ = stale.Rollback(ctx) // the failure below, not a connection held past the test
	}
	require.ErrorIs(t, err, checkpoint.ErrFenced, "Begin skipped its check past the lease's half")
}
