package checkpoint

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// renewer runs lease renewals on a connection of the store's own, outside the pool.
//
// Guards against: a live, connected worker whose leases lapse because its pool is busy. A
// renewal taken from the pool queues behind every step transaction, send and River query of
// the process; with pgx's default pool (4 connections on a small machine) and eight runs
// stepping, the heartbeats waited past the lease and maintenance took healthy runs over (the
// sample's classic chaos profile, 2 runs in 5). A lease says "this process is alive and can
// reach the database", which is what a connection of its own measures, and nothing else:
// a frozen process still stops renewing, a process cut off from the database still cannot.
//
// The connection is opened in the background when a heartbeat starts (and whenever a renewal
// finds it missing), and closed once no heartbeat has started and no renewal has used it for a
// lease; one renewal at a time uses it. A renewal never spends its budget opening it:
// it waits for an opening connection at most half of what it has left, then goes through the
// pool, as it does when the connection cannot be opened at all (the server refuses more
// connections). Guards against: a live owner losing its lease because a server starved of
// CPU forks backends slowly (connecting took seconds beside a CPU hog) while its pool had
// connections open (the long chaos profile, issue 21).
type renewer struct {
	pool   *pgxpool.Pool
	cfg    *pgx.ConnConfig
	linger time.Duration

	sem     chan struct{} // held while a renewal, close or finished dial uses conn and dialing
	conn    *pgx.Conn
	idle    *time.Timer
	dialing chan struct{} // closed when the connection being opened is installed (or failed)
}

func newRenewer(pool *pgxpool.Pool, linger time.Duration) *renewer {
	cfg := pool.Config().ConnConfig.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	if cfg.RuntimeParams["application_name"] == "" {
		// So an operator can tell it from the pool's connections in pg_stat_activity.
		cfg.RuntimeParams["application_name"] = "stepwise lease renewal"
	}
	return &renewer{pool: pool, cfg: cfg, linger: linger, sem: make(chan struct{}, 1)}
}

// warm starts opening the connection if there is none, so that a heartbeat's first renewal
// finds it open, and keeps an open one from closing for lack of use: with slices shorter
// than a heartbeat interval, a busy worker renews rarely but starts heartbeats all the time.
func (r *renewer) warm() {
	select {
	case r.sem <- struct{}{}:
	default:
		return // a renewal is using it
	}
	defer func() { <-r.sem }()
	if r.conn == nil || r.conn.IsClosed() {
		r.conn = nil
		r.dialLocked()
		return
	}
	r.armIdle() // renewals are coming: keep it open for them
}

// exec runs a renewal statement on the renewer's connection, or on the pool while it has none
// (see renewer). A connection that turns out to be dead (the server restarted, a failover,
// an idle timeout) is replaced, and the statement tried once more.
func (r *renewer) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	for try := 0; ; try++ {
		if !r.open(ctx) {
			return r.pool.Exec(ctx, sql, args...)
		}
		tag, err := r.conn.Exec(ctx, sql, args...)
		dead := err != nil && r.conn.IsClosed()
		if dead {
			r.conn = nil
		}
		r.armIdle()
		<-r.sem
		if !dead || try > 0 || ctx.Err() != nil {
			return tag, err
		}
	}
}

// open returns true holding sem with conn open, or false (sem not held) when the connection
// is not free and open within half of what is left of ctx: it may be opening (it goes on in
// the background), or in use by a renewal that waits for a row lock.
func (r *renewer) open(ctx context.Context) bool {
	var timeout <-chan time.Time
	if deadline, ok := ctx.Deadline(); ok {
		t := time.NewTimer(time.Until(deadline) / 2)
		defer t.Stop()
		timeout = t.C
	}
	for dialed := false; ; dialed = true {
		select {
		case r.sem <- struct{}{}:
		case <-timeout:
			return false
		case <-ctx.Done():
			return false
		}
		if r.conn != nil && !r.conn.IsClosed() {
			return true
		}
		r.conn = nil
		if dialed {
			<-r.sem
			return false // the dial failed
		}
		done := r.dialLocked()
		<-r.sem
		select {
		case <-done:
		case <-timeout:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// dialLocked starts opening the connection unless that is under way, and returns what is
// closed once it is done. Called with sem held.
func (r *renewer) dialLocked() chan struct{} {
	if r.dialing != nil {
		return r.dialing
	}
	done := make(chan struct{})
	r.dialing = done
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), max(5*r.linger, 10*time.Second))
		conn, err := pgx.ConnectConfig(ctx, r.cfg)
		cancel()
		r.sem <- struct{}{}
		defer func() { <-r.sem }()
		r.dialing = nil
		switch {
		case err != nil:
		case r.conn == nil:
			r.conn = conn
			r.armIdle()
		default:
			cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(cctx)
			ccancel()
		}
	}()
	return done
}

// armIdle (re)starts the timer that closes the connection after linger without renewals.
// Called with sem held.
func (r *renewer) armIdle() {
	if r.idle == nil {
		r.idle = time.AfterFunc(r.linger, r.closeIdle)
		return
	}
	r.idle.Reset(r.linger)
}

func (r *renewer) closeIdle() {
	select {
	case r.sem <- struct{}{}:
	default:
		return // a renewal is running; it re-arms the timer when done
	}
	defer func() { <-r.sem }()
	if r.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = r.conn.Close(ctx)
		cancel()
		r.conn = nil
	}
}
