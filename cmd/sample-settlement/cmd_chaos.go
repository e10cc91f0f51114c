package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/chaos"
	"github.com/stepwise-go/stepwise/internal/pgserver"
	"github.com/stepwise-go/stepwise/workflowtest"
)

func init() {
	register("chaos", "settle a date while worker processes are killed and frozen at random, then check every invariant", runChaos)
	register("chaos-worker", "(internal) one worker process of the chaos suite", runChaosWorker)
}

func runChaos(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := &chaos.Config{}
	var seed uint64
	fs.DurationVar(&cfg.Duration, "duration", 45*time.Second, "how long the killer runs; then the system runs to rest and is checked")
	fs.Uint64Var(&seed, "seed", 0, "repeat a run: the seed a previous run printed (default: from the clock)")
	fs.IntVar(&cfg.Workers, "workers", 4, "worker processes")
	fs.IntVar(&cfg.Merchants, "merchants", 20000, "merchants settled")
	fs.IntVar(&cfg.Shards, "shards", 8, "runs (shards) per date")
	fs.DurationVar(&cfg.Lease, "lease", 2*time.Second, "run lease of the workers")
	fs.BoolVar(&cfg.Soak, "soak", true, "keep the load up for the whole --duration: when a date is at rest, seed and settle the next one (false: one date)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: sample-settlement chaos [flags]

Settles dates of -merchants merchants in -shards runs on -workers worker processes,
against a bank that fails 10%% of requests, while a killer SIGKILLs a random worker every
0.5-2s (and restarts it) and every sixth time SIGSTOPs one past its lease instead. With
-soak (the default) a date at rest is followed by the next one until -duration ends. Then it
waits for rest and checks the invariants 1-6 of docs/design.md for every date, printing the first
violation and the seed to repeat the run. Exits non-zero on any violation. Uses DATABASE_URL's server (or
finds one like the demo) and a fresh database of its own, dropped afterwards.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if cfg.Duration <= 0 || cfg.Workers < 1 || cfg.Merchants < 1 || cfg.Shards < 1 || cfg.Lease <= 0 {
		return usageError("--duration, --lease, --workers, --merchants and --shards must be positive")
	}
	for _, err := range []error{
		checkDuration("duration", cfg.Duration, time.Second, 7*24*time.Hour),
		checkDuration("lease", cfg.Lease, 300*time.Millisecond, time.Hour),
		checkInt("workers", cfg.Workers, 1, 64),
		checkInt("merchants", cfg.Merchants, 1, maxMerchants),
		checkInt("shards", cfg.Shards, 1, maxShards),
	} {
		if err != nil {
			return err
		}
	}
	cfg.Seed = seed

	srv, err := pgserver.Find(ctx, &pgserver.Options{EnvVars: []string{"DATABASE_URL"}, Logf: func(f string, a ...any) { fmt.Fprintf(stderr, f+"\n", a...) }})
	if err != nil {
		return err
	}
	defer srv.Close()
	dbURL, drop, err := freshDatabase(ctx, srv.URL, fmt.Sprintf("stepwise_chaos_%d", os.Getpid()))
	if err != nil {
		return err
	}
	defer drop()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "seeding %d merchants...\n", cfg.Merchants)
	err = chaos.Prepare(ctx, pool, cfg)
	pool.Close()
	if err != nil {
		return err
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	var mu sync.Mutex
	var procs []*execWorker
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range procs {
			p.Kill()
		}
	}()
	cfg.DatabaseURL = dbURL
	cfg.Progress = stdout
	cfg.Logf = func(f string, a ...any) { fmt.Fprintf(stdout, f+"\n", a...) }
	cfg.StartWorker = func(env []string) (workflowtest.Worker, error) {
		w, err := startExecWorker(self, env, stderr)
		if err == nil {
			mu.Lock()
			procs = append(procs, w)
			mu.Unlock()
		}
		return w, err
	}
	res, err := chaos.Run(ctx, cfg)
	if res != nil {
		fmt.Fprintln(stdout, res.Summary())
	}
	if err != nil {
		return err
	}
	if !res.OK() {
		return errors.New("chaos: invariants violated or the system did not come to rest (see above)")
	}
	return nil
}

func runChaosWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chaos-worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, `Usage: sample-settlement chaos-worker

One worker process of "sample-settlement chaos", which starts it; not meant to be run by
hand. It reads DATABASE_URL, BANK_URL, CHAOS_LEASE, CHAOS_SHARDS and CHAOS_BATCH from the
environment and runs the settlement service until SIGTERM.`)
	}
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	env := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return chaos.WorkerMain(ctx, env)
}

// freshDatabase creates a database on the server at adminURL and returns its URL and a
// function that drops it.
func freshDatabase(ctx context.Context, adminURL, name string) (string, func(), error) {
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", nil, fmt.Errorf("connecting to %s: %w", redactURL(adminURL), err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		admin.Close(ctx)
		return "", nil, fmt.Errorf("creating database %s: %w", name, err)
	}
	cfg := admin.Config().Copy()
	cfg.Database = name
	dbURL := fmt.Sprintf("postgres://%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, name)
	if cfg.Password != "" {
		dbURL = fmt.Sprintf("postgres://%s:%s@%s:%d/%s", cfg.User, cfg.Password, cfg.Host, cfg.Port, name)
	}
	return dbURL, func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		admin.Close(dctx)
	}, nil
}

// execWorker is a chaos worker process started from this binary.
type execWorker struct {
	cmd    *exec.Cmd
	done   chan struct{}
	exited bool
	mu     sync.Mutex
}

func startExecWorker(self string, env []string, stderr io.Writer) (*execWorker, error) {
	cmd := exec.Command(self, "chaos-worker")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting a chaos worker: %w", err)
	}
	w := &execWorker{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		w.mu.Lock()
		w.exited = true
		w.mu.Unlock()
		close(w.done)
	}()
	return w, nil
}

func (w *execWorker) Pid() int { return w.cmd.Process.Pid }
func (w *execWorker) Kill() {
	_ = syscall.Kill(-w.Pid(), syscall.SIGKILL)
	<-w.done
}
func (w *execWorker) Stop() error { return syscall.Kill(-w.Pid(), syscall.SIGSTOP) }
func (w *execWorker) Cont() error { return syscall.Kill(-w.Pid(), syscall.SIGCONT) }
func (w *execWorker) Exited() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.exited
}
