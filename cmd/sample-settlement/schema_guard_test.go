package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/workflowtest"
)

// Every command that opens the database refuses one migrated by a newer
// binary, Stepwise's schema or River's, with the message migrate gives ("... newer than
// this Stepwise binary ...; deploy the newer binary"), before it reads or writes anything.
// serve runs in a real process: on a build without the guard it would start serving.
func TestEveryCommandRefusesANewerSchema(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, bump, want string }{
		{"stepwise", `INSERT INTO stepwise_migration (version, name) VALUES (999, 'from_the_future')`, "database has version 999"},
		{"river", `INSERT INTO river_migration (line, version) VALUES ('main', 999)`, "River schema version 999"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dbURL := seededDBURL(t)
			pool, err := pgxpool.New(context.Background(), dbURL)
			require.NoError(t, err)
			_, err = pool.Exec(context.Background(), tc.bump)
			pool.Close()
			require.NoError(t, err)

			db := []string{"--database-url", dbURL}
			for _, args := range [][]string{
				{"migrate"},
				{"report", "--date", testDateText},
				{"invariants", "--date", testDateText},
				{"resolve", "00000000-0000-0000-0000-000000000001", "--to", "SUCCEEDED", "--reason", "checked by hand", "--actor", "ops"},
				{"settle", "--date", testDateText, "--work=false"},
				{"statement-arrived", "--date", testDateText},
				{"seed", "--date", "2026-03-02", "--merchants", "10", "--transactions", "10"},
				{"demo", "--merchants", "10"},
			} {
				r := runCLI(t, append(args, db...)...)
				require.Equal(t, 1, r.code, "%v must refuse the newer schema", args)
				require.Contains(t, r.stderr, "newer than this Stepwise binary", args)
				require.Contains(t, r.stderr, tc.want, args)
				require.Contains(t, r.stderr, "deploy the newer binary", args)
			}
			for _, migrate := range []string{"--migrate=false", "--migrate=true"} {
				args := append([]string{"serve", "--addr", "127.0.0.1:0", "--scheduler=false", migrate}, db...)
				p := workflowtest.Start(t, "cli", "SS_ARGS="+strings.Join(args, argsSep))
				done := make(chan error, 1)
				go func() { done <- p.Wait() }()
				select {
				case err := <-done:
					require.Error(t, err, "serve %s must refuse the newer schema", migrate)
				case <-time.After(60 * time.Second):
					p.Kill()
					t.Fatalf("serve %s did not refuse the newer schema:\n%s", migrate, strings.Join(p.Lines(), "\n"))
				}
				out := strings.Join(p.Lines(), "\n")
				require.Contains(t, out, "newer than this Stepwise binary", migrate)
				require.Contains(t, out, tc.want, migrate)
				require.NotContains(t, out, "serving: ", migrate)
			}
		})
	}
}
