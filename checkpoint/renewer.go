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
// The connection is opened on the first renewal and closed once no renewal has used it for
// a lease (no heartbeat is running then); one renewal at a time uses it. Should it not open
// (the server refuses more connections), renewals fall back to the pool, as before.
type renewer struct {
	pool   *pgxpool.Pool
	cfg    *pgx.ConnConfig
	linger time.Duration

	sem  chan struct{} // held while a renewal, connect or close uses conn
	conn *pgx.Conn
	idle *time.Timer
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

// exec runs a renewal statement on the renewer's connection, reconnecting once if that
// connection turns out to be dead (the server restarted, a failover, an idle timeout).
func (r *renewer) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return pgconn.CommandTag{}, ctx.Err()
	}
	defer func() {
		r.armIdle()
		<-r.sem
	}()
	for try := 0; ; try++ {
		fresh := false
		if r.conn == nil || r.conn.IsClosed() {
			conn, err := pgx.ConnectConfig(ctx, r.cfg)
			if err != nil {
				if ctx.Err() != nil {
					return pgconn.CommandTag{}, err
				}
				// Never worse than before: the pool's connections may still get through.
				return r.pool.Exec(ctx, sql, args...)
			}
			r.conn, fresh = conn, true
		}
		tag, err := r.conn.Exec(ctx, sql, args...)
		if err != nil && r.conn.IsClosed() {
			r.conn = nil
			if !fresh && try == 0 && ctx.Err() == nil {
				continue // a connection that died while idle: one more try on a new one
			}
		}
		return tag, err
	}
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
