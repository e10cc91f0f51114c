package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

// A database a newer release migrated is refused by every command, migrate status included
// (exit 1, naming the fix), and nothing is written; an unmigrated one is refused by the
// commands that read it, naming "stepwise migrate", which then migrates it.
func TestSchemaVersionsAreChecked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	newer := testkit.DB(t)
	newerURL := newer.Config().ConnString()
	_, err := newer.Exec(ctx, `INSERT INTO stepwise_migration (version, name) SELECT max(version) + 1, 'from_the_future' FROM stepwise_migration`)
	require.NoError(t, err)
	before := snapshot(t, newer)
	for _, args := range [][]string{{"migrate", "status"}, {"migrate"}, {"runs"}, {"ops"}, {"prune", "--older-than", "48h", "--apply"}} {
		r := stepwise(t, newerURL, args...)
		require.Equal(t, 1, r.code, "%q", args)
		require.Contains(t, r.stderr, "newer than this Stepwise binary", "%q", args)
		require.Contains(t, r.stderr, "go install github.com/stepwise-go/stepwise/cmd/stepwise@", "%q", args)
	}
	require.Equal(t, before, snapshot(t, newer))

	emptyURL := testkit.EmptyDBURL(t)
	r := stepwise(t, emptyURL, "runs")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `is not migrated (Stepwise schema 0 of`)
	require.Contains(t, r.stderr, `run "stepwise migrate" first`)
	r = stepwise(t, emptyURL, "migrate", "status").ok(t)
	require.Contains(t, r.stdout, "behind: stepwise migrate")
	stepwise(t, emptyURL, "migrate").ok(t)
	require.Contains(t, stepwise(t, emptyURL, "runs").ok(t).stdout, "no runs match")
}

// The database URL's password is never printed: not in --help (its default comes from the
// environment), not in a connection error. Not parallel: it sets DATABASE_URL.
func TestNoPasswordIsPrinted(t *testing.T) {
	const secret = "s3cr3t-pw"
	url := "postgres://ops:" + secret + "@127.0.0.1:1/prod?sslmode=disable"
	t.Setenv("DATABASE_URL", url)
	r := stepwise(t, url, "runs")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "does not answer")
	require.Contains(t, r.stderr, "127.0.0.1:1/prod")
	require.NotContains(t, r.stdout+r.stderr, secret)
	r = stepwise(t, "", "ops", "resolve", "--help")
	require.Equal(t, 0, r.code)
	require.Contains(t, r.stderr, "postgres://ops:xxxxx@127.0.0.1:1/prod", "the default is shown, redacted")
	require.NotContains(t, r.stdout+r.stderr, secret)
	r = stepwise(t, "", "runs")
	require.Equal(t, 1, r.code)
	require.NotContains(t, r.stdout+r.stderr, secret)
	r = stepwise(t, "", "runs", "--database-url", "postgres://ops:"+secret+"@[::1")
	require.Equal(t, 2, r.code)
	require.NotContains(t, r.stdout+r.stderr, secret)
	require.True(t, strings.Contains(r.stderr, "not a PostgreSQL URL"), r.stderr)
}
