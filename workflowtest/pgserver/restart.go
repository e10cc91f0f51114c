package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
)

// ThrowawayOptions configures Throwaway. A nil *ThrowawayOptions uses the defaults.
type ThrowawayOptions struct {
	// Logf receives progress while the cluster starts. Defaults to discarding.
	Logf func(format string, args ...any)
}

// ErrNoBinaries is returned (wrapped) by Throwaway when no initdb, pg_ctl and postgres are
// installed: a drill that needs a server of its own cannot run.
var ErrNoBinaries = errNoBinaries

// Throwaway starts a throwaway cluster (step 3 of Find) even when another server is running,
// for drills that crash and restart the server under the code they test: Find's local or
// configured server is never stopped, so such a drill needs one of its own. Close stops it
// and removes its directory.
//
// Unlike Find's throwaway clusters it keeps synchronous_commit on, as production does: with
// it off, a server stopped by StopImmediate loses commits it had acknowledged (the WAL still
// in its buffers), and a drill would report as lost what a production server keeps. fsync
// stays off: only the server crashes in a drill, not the machine, so the WAL it has written
// survives in the kernel's cache.
func Throwaway(ctx context.Context, opts *ThrowawayOptions) (*Server, error) {
	o := &Opts{durableCommits: true}
	if opts != nil {
		o.Logf = opts.Logf
	}
	o = o.WithDefaults()
	o.durableCommits = true
	return startThrowaway(ctx, o)
}

var errNotThrowaway = errors.New("pgserver: only a throwaway cluster (Throwaway) can be stopped and started; Find never stops a server it did not start")

// StopImmediate stops a throwaway cluster's server as a crash would: pg_ctl stop -m
// immediate, every backend ends at once, open transactions are lost, no shutdown
// checkpoint; the next Start replays the WAL (crash recovery). Clients see their
// connections dropped and new ones refused until Start.
func (s *Server) StopImmediate(ctx context.Context) error {
	if s == nil || s.cluster == nil {
		return errNotThrowaway
	}
	c := s.cluster
	if out, err := c.run(ctx, "pg_ctl", "stop", "-D", c.dataDir(), "-m", "immediate", "-w", "-t", "30"); err != nil {
		return fmt.Errorf("stopping throwaway cluster in %s (immediate): %w\n%s", c.dir, err, out)
	}
	return nil
}

// Start starts a stopped throwaway cluster's server again, on the port it had (0) or on
// another one (a failover-like address change), and returns when it accepts connections,
// crash recovery done. URL follows the port.
func (s *Server) Start(ctx context.Context, port int) error {
	if s == nil || s.cluster == nil {
		return errNotThrowaway
	}
	c := s.cluster
	if _, err := os.Stat(filepath.Join(c.dataDir(), "postmaster.pid")); err == nil {
		return fmt.Errorf("pgserver: the throwaway cluster in %s is running; stop it first", c.dir)
	}
	if port == 0 {
		port = c.port
	}
	if err := c.serve(ctx, port); err != nil {
		return err
	}
	s.URL = (&url.URL{Scheme: "postgres", User: url.User("postgres"), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)), Path: "/postgres", RawQuery: "sslmode=disable"}).String()
	return nil
}

// Port is the port a throwaway cluster's server listens on (0 for other servers).
func (s *Server) Port() int {
	if s == nil || s.cluster == nil {
		return 0
	}
	return s.cluster.port
}
