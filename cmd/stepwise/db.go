package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/internal/audittext"
	"github.com/stepwise-go/stepwise/migrations"
)

// secretURL is a string flag holding a URL that may carry a password. Guards against --help
// printing the password as the flag's default (the default comes from $DATABASE_URL).
type secretURL struct{ s *string }

func (v secretURL) String() string {
	if v.s == nil || *v.s == "" {
		return ""
	}
	return redactURL(*v.s)
}

func (v secretURL) Set(s string) error { *v.s = s; return nil }

// redactURL returns u with its password replaced by "xxxxx"; a string that is not a URL is
// not shown at all.
func redactURL(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return "(unparseable URL)"
	}
	if parsed.User != nil {
		if _, has := parsed.User.Password(); has {
			parsed.User = url.UserPassword(parsed.User.Username(), "xxxxx")
		}
	}
	if strings.Contains(strings.ToLower(parsed.RawQuery), "password") {
		parsed.RawQuery = "(redacted)"
	}
	return parsed.String()
}

// where names a database by host, port and name: never its user's password.
func where(pool *pgxpool.Pool) string {
	cfg := pool.Config().ConnConfig
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}

// open connects to the database and proves it answers, refusing a schema newer than this
// binary (migrations.CheckNotNewer): reading or writing rows whose meaning this binary does
// not know could misreport money. Unless forMigrate, it also refuses a database that lacks
// migrations, naming the command to run: a query on a missing table says neither.
func (f *flags) open(ctx context.Context, forMigrate bool) (*pgxpool.Pool, *migrations.SchemaState, error) {
	if f.dbURL == "" {
		return nil, nil, usageError("%s: no database: set DATABASE_URL or pass --database-url postgres://user@host:5432/db", f.c.path)
	}
	cfg, err := pgxpool.ParseConfig(f.dbURL)
	if err != nil {
		// The parse error may quote the URL, password included.
		return nil, nil, usageError("%s: the database URL is not a PostgreSQL URL such as postgres://user@host:5432/db", f.c.path)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	cfg.ConnConfig.RuntimeParams["application_name"] = "stepwise-cli"
	at := fmt.Sprintf("%s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("database %s: %w", at, err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		var op *net.OpError
		if errors.As(err, &op) {
			err = op
		}
		return nil, nil, fmt.Errorf("database %s does not answer (%v): start PostgreSQL there or fix DATABASE_URL / --database-url", at, err)
	}
	st, err := migrations.CheckNotNewer(pingCtx, pool)
	if err != nil {
		pool.Close()
		if errors.Is(err, migrations.ErrDatabaseNewer) {
			return nil, nil, fmt.Errorf("database %s: %w (install the stepwise command of the release that migrated it: go install github.com/stepwise-go/stepwise/cmd/stepwise@<that version>)", at, err)
		}
		return nil, nil, fmt.Errorf("database %s: %w", at, err)
	}
	if !forMigrate && !st.Current() {
		pool.Close()
		return nil, nil, fmt.Errorf("database %s is not migrated (Stepwise schema %d of %d, River %d of %d): run \"stepwise migrate\" first (it is safe to run again), or start your service, which migrates",
			at, st.Stepwise, st.StepwiseKnown, st.River, st.RiverKnown)
	}
	return pool, st, nil
}

// Bounds of audit text: a sentence and a ticket, a name.
const (
	maxReasonLen = 2000
	maxActorLen  = 200
)

// auditFlags are --actor and --reason of a command that writes the audit trail.
type auditFlags struct{ actor, reason string }

func (a *auditFlags) register(f *flags, reasonHelp string) {
	f.StringVar(&a.reason, "reason", "", reasonHelp+" (required, kept in the audit trail forever)")
	f.StringVar(&a.actor, "actor", os.Getenv("USER"), "who acts, for the audit trail (default $USER)")
}

// check refuses a missing, over-long or misleading actor or reason before anything runs: the
// SDK's rule (a newline forges a second audit line, U+202E reverses what the reader sees).
func (a *auditFlags) check(path string) error {
	switch {
	case strings.TrimSpace(a.reason) == "":
		return usageError("%s: --reason is required: it is kept in the audit trail (a ticket, what the bank said)", path)
	case strings.TrimSpace(a.actor) == "":
		return usageError("%s: --actor is required when $USER is not set: the audit trail names who acted", path)
	case len(a.reason) > maxReasonLen:
		return usageError("%s: --reason is %d bytes: keep it within %d", path, len(a.reason), maxReasonLen)
	case len(a.actor) > maxActorLen:
		return usageError("%s: --actor is %d bytes: keep it within %d", path, len(a.actor), maxActorLen)
	}
	if err := audittext.Check("--actor", a.actor); err != nil {
		return usageError("%s: %v", path, err)
	}
	if err := audittext.Check("--reason", a.reason); err != nil {
		return usageError("%s: %v", path, err)
	}
	return nil
}

// seenVersion checks --seen-version: 0 (not given) or a version read (1 or more).
func seenVersion(path string, v int64, what string) error {
	if v < 0 {
		return usageError("%s: --seen-version %d: want the version \"%s show\" printed (1 or more)", path, v, what)
	}
	return nil
}
