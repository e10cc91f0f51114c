package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SkipLocalEnv names the variable that, set to 1, makes Find skip the server on
// 127.0.0.1:5432. For testing the throwaway fallback only.
const SkipLocalEnv = "STEPWISE_PG_SKIP_LOCAL"

// localAddr is where Find looks for an already running server.
const localAddr = "127.0.0.1:5432"

// Opts configures Find. A nil *Opts uses the defaults.
type Opts struct {
	// EnvVars are the variables holding a server URL, tried in order; the first one set
	// wins. An empty string entry is ignored.
	//
	// Defaults to TEST_DATABASE_URL, DATABASE_URL.
	EnvVars []string

	// Logf receives one line saying which server was chosen, and progress while a
	// throwaway cluster starts.
	//
	// Defaults to discarding.
	Logf func(format string, args ...any)

	// SkipEnv ignores EnvVars. For tests of the fallback.
	//
	// Defaults to false.
	SkipEnv bool

	// SkipLocal skips the server on 127.0.0.1:5432, as STEPWISE_PG_SKIP_LOCAL=1 does. For
	// tests of the fallback.
	//
	// Defaults to false.
	SkipLocal bool

	// tempDir overrides the directory that throwaway clusters are created in (tests).
	tempDir string
	// durableCommits keeps synchronous_commit on in a throwaway cluster (Throwaway).
	durableCommits bool
}

// WithDefaults returns a copy of o with unset fields filled in.
func (o *Opts) WithDefaults() *Opts {
	var out Opts
	if o != nil {
		out = *o
	}
	if out.EnvVars == nil {
		out.EnvVars = []string{"TEST_DATABASE_URL", "DATABASE_URL"}
	}
	if out.Logf == nil {
		out.Logf = func(string, ...any) {}
	}
	if os.Getenv(SkipLocalEnv) == "1" {
		out.SkipLocal = true
	}
	return &out
}

// Server is a PostgreSQL server chosen by Find.
type Server struct {
	// URL is an admin URL: it names a database that exists (postgres, or the one in the
	// variable's URL) as a user that may create databases (except, possibly, for a server
	// from a variable, which is used as given).
	URL string

	// Source says where the server came from: "env:NAME", "local:127.0.0.1:5432" or
	// "throwaway:<dir>".
	Source string

	local   bool
	cluster *cluster // nil unless throwaway

	closeOnce sync.Once
	closeErr  error
}

// Local reports whether the server runs on this machine (a throwaway cluster, the local
// server, or a variable whose URL names a loopback address or a unix socket). Only then do
// process ids recorded in database names mean anything to this process.
func (s *Server) Local() bool { return s.local }

// Close stops and removes a throwaway cluster. For any other source it does nothing: Find
// never stops a server it did not start. Close is safe to call more than once.
func (s *Server) Close() error {
	if s == nil || s.cluster == nil {
		return nil
	}
	s.closeOnce.Do(func() { s.closeErr = s.cluster.stop() })
	return s.closeErr
}

// Find returns a PostgreSQL server, trying the sources described in the package comment in
// order. The caller must Close the returned Server.
func Find(ctx context.Context, opts *Opts) (*Server, error) {
	opts = opts.WithDefaults()

	if !opts.SkipEnv {
		for _, name := range opts.EnvVars {
			if name == "" {
				continue
			}
			raw := os.Getenv(name)
			if raw == "" {
				continue
			}
			srv, err := fromEnv(ctx, name, raw)
			if err != nil {
				return nil, err
			}
			opts.Logf("pgserver: using PostgreSQL from $%s (%s)", name, hostOf(raw))
			return srv, nil
		}
	}

	var localErr error
	if !opts.SkipLocal {
		srv, err := fromLocal(ctx)
		if err == nil {
			opts.Logf("pgserver: using PostgreSQL on %s (%s)", localAddr, redact(srv.URL))
			return srv, nil
		}
		localErr = err
	}

	srv, err := startThrowaway(ctx, opts)
	if err == nil {
		return srv, nil
	}
	if errors.Is(err, errNoBinaries) {
		var why string
		if localErr != nil {
			why = fmt.Sprintf(" (%s: %v)", localAddr, localErr)
		}
		return nil, fmt.Errorf("%w: none of %s is set, nothing usable answers on %s%s, and no initdb/pg_ctl/postgres binaries were found on PATH or in %s. "+
			"Install PostgreSQL (apt-get install postgresql, brew install postgresql@16, dnf install postgresql-server) or set %s to a server's URL",
			ErrNoServer, strings.Join(opts.EnvVars, ", "), localAddr, why, strings.Join(binDirGlobs, ", "), firstNonEmpty(opts.EnvVars))
	}
	return nil, err
}

func fromEnv(ctx context.Context, name, raw string) (*Server, error) {
	host := hostOf(raw)
	cfg, err := pgx.ParseConfig(raw)
	if err != nil {
		// The parse error may quote the URL, password included; say only what is wrong.
		return nil, &EnvServerError{Var: name, Host: "an unparsable URL", Err: errors.New("not a PostgreSQL URL or keyword/value string")}
	}
	if err := ping(ctx, cfg); err != nil {
		return nil, &EnvServerError{Var: name, Host: host, Err: err}
	}
	return &Server{URL: raw, Source: "env:" + name, local: isLoopback(cfg.Host)}, nil
}

// fromLocal looks for a server on 127.0.0.1:5432 that lets one of the usual users create
// databases.
func fromLocal(ctx context.Context) (*Server, error) {
	var users []string
	seen := map[string]bool{}
	for _, u := range []string{"postgres", os.Getenv("PGUSER"), os.Getenv("USER")} {
		if u != "" && !seen[u] {
			seen[u] = true
			users = append(users, u)
		}
	}
	var errs []error
	for _, user := range users {
		for _, db := range []string{"postgres", "test"} {
			u := (&url.URL{Scheme: "postgres", User: url.User(user), Host: localAddr, Path: "/" + db, RawQuery: "sslmode=disable"}).String()
			cfg, err := pgx.ParseConfig(u)
			if err != nil {
				return nil, fmt.Errorf("building local URL: %w", err)
			}
			ok, err := canCreateDB(ctx, cfg)
			if err == nil && ok {
				return &Server{URL: u, Source: "local:" + localAddr, local: true}, nil
			}
			if err == nil {
				err = fmt.Errorf("user %q may not create databases", user)
			}
			errs = append(errs, err)
			if isConnRefused(err) {
				// Nothing listens: the other users and databases would be refused too.
				return nil, err
			}
		}
	}
	return nil, errors.Join(errs...)
}

// ping connects once with a short timeout. Environment PG* variables are not consulted for
// anything the URL does not say (pgx does read them for missing parts, as psql does).
func ping(ctx context.Context, cfg *pgx.ConnConfig) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.Ping(ctx)
}

func canCreateDB(ctx context.Context, cfg *pgx.ConnConfig) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	err = conn.QueryRow(ctx, "SELECT rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = current_user").Scan(&ok)
	return ok, err
}

// isConnRefused reports a failed dial: nothing listens there, so trying other users and
// databases on the same address is pointless.
func isConnRefused(err error) bool {
	var opErr *net.OpError
	return errors.As(err, &opErr)
}

// hostOf returns host:port of a URL (never the password), or a placeholder.
func hostOf(raw string) string {
	cfg, err := pgconn.ParseConfig(raw)
	if err != nil {
		return "an unparsable URL"
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return fmt.Sprintf("unix socket %s/.s.PGSQL.%d", cfg.Host, cfg.Port)
	}
	return net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return hostOf(raw)
	}
	return u.Redacted()
}

func isLoopback(host string) bool {
	if host == "" || strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func firstNonEmpty(s []string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return "DATABASE_URL"
}
