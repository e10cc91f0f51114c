package testkit

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// RiverChild is the body of a workflowtest role that works River jobs in a child process:
// it opens a pool on env["DATABASE_URL"], lets install add its workers (e.g. an outbox's
// Install) to a quiet River config that fetches fast, starts the client, prints "ready" (what
// workflowtest.Start waits for), works until ctx ends (the parent's SIGTERM) and stops the
// client.
func RiverChild(ctx context.Context, env map[string]string, install func(pool *pgxpool.Pool, cfg *river.Config) error) error {
	pool, err := pgxpool.New(ctx, env["DATABASE_URL"])
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := &river.Config{Logger: slog.New(slog.DiscardHandler), FetchCooldown: 20 * time.Millisecond, FetchPollInterval: 100 * time.Millisecond}
	if err := install(pool, cfg); err != nil {
		return err
	}
	client, err := river.NewClient[pgx.Tx](riverpgxv5.New(pool), cfg)
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	fmt.Println("ready")
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return client.Stop(stopCtx)
}
