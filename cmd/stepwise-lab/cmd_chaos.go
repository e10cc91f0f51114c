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

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/cmd/stepwise-lab/chaos"
	"github.com/stepwise-go/stepwise/workflowtest"
	"github.com/stepwise-go/stepwise/workflowtest/pgserver"
)

func init() {
	prog.Register("chaos", "settle a date while worker processes are killed and frozen at random, then check every invariant", runChaos)
	prog.Register("chaos-worker", "(internal) one worker process of the chaos suite", runChaosWorker)
}

func runChaos(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flags := &chaos.Config{}
	var seed uint64
	profile := fs.String("profile", "classic", "the chaos profile: "+strings.Join(chaos.Profiles, ", "))
	fs.DurationVar(&flags.Duration, "duration", 45*time.Second, "how long the killer runs (mix: the whole soak); then the system runs to rest and is checked")
	fs.Uint64Var(&seed, "seed", 0, "repeat a run: the seed a previous run printed (default: from the clock)")
	fs.IntVar(&flags.Workers, "workers", 4, "worker processes")
	fs.IntVar(&flags.Merchants, "merchants", 20000, "merchants settled (settle profiles)")
	fs.IntVar(&flags.Shards, "shards", 8, "runs (shards) per date (settle profiles)")
	fs.DurationVar(&flags.Lease, "lease", 2*time.Second, "run lease of the workers")
	withRetention := fs.Bool("retention", false, "run retention.Prune every second with an age of 2s beside the chaos, and an operator resolving payouts by hand; "+
		"then check that no run key restarts from zero, no slot evidence is lost and every manual decision is still attributable")
	fs.BoolVar(&flags.Soak, "soak", true, "keep the load up for the whole --duration: when a date is at rest, seed and settle the next one (false: one date)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: stepwise-lab chaos [--profile NAME] [flags]

Runs worker processes of the sample service while a killer SIGKILLs and SIGSTOPs them, against a
strict bank that never deduplicates (every request it receives is a payment) and logs every
request. When the system is at rest it checks docs/design.md's invariants, the bank's request log (no
two requests for one operation in flight, none after the ledger recorded it terminal, not-found
believed only after the previous request ended plus the grace, one effect per operation with the
ledger's amount) and the takeovers (none of a run whose worker was alive, running and connected;
no run failed before MaxAttempts crashes). It prints the seed and the counts, the first violation
of each kind, and exits non-zero on any. Uses DATABASE_URL's server (or finds one like the demo)
and fresh databases of its own, dropped afterwards.

Profiles:
`)
		for _, p := range chaos.Profiles {
			fmt.Fprintf(stderr, "  %-18s %s\n", p, chaos.ProfileDoc(p))
		}
		fmt.Fprintf(stderr, `
Flags not given keep each profile's own values
(classic: the defaults below).

Flags:
`)
		fs.PrintDefaults()
	}
	if err := cmdline.ParseFlags(fs, args, false); err != nil {
		return err
	}
	if flags.Duration <= 0 || flags.Workers < 1 || flags.Merchants < 1 || flags.Shards < 1 || flags.Lease <= 0 {
		return cmdline.UsageError("--duration, --lease, --workers, --merchants and --shards must be positive")
	}
	for _, err := range []error{
		cmdline.CheckDuration("duration", flags.Duration, time.Second, 7*24*time.Hour),
		cmdline.CheckDuration("lease", flags.Lease, 300*time.Millisecond, time.Hour),
		cmdline.CheckInt("workers", flags.Workers, 1, 64),
		cmdline.CheckInt("merchants", flags.Merchants, 1, maxMerchants),
		cmdline.CheckInt("shards", flags.Shards, 1, maxShards),
	} {
		if err != nil {
			return err
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	// configFor builds one profile's config with the flags given on the command line.
	configFor := func(name string, seed uint64) (*chaos.Config, error) {
		cfg, err := chaos.ProfileConfig(name, false)
		if err != nil {
			return nil, cmdline.UsageError("%v", err)
		}
		classic := name == "classic"
		// Under mix, --duration is the whole soak: each profile keeps its own length.
		if classic || (set["duration"] && *profile != "mix") {
			cfg.Duration = flags.Duration
		}
		if classic || set["workers"] {
			cfg.Workers = flags.Workers
		}
		if classic || set["merchants"] {
			cfg.Merchants = flags.Merchants
		}
		if classic || set["shards"] {
			cfg.Shards = flags.Shards
		}
		if classic || set["lease"] {
			cfg.Lease = flags.Lease
		}
		if classic || set["soak"] {
			cfg.Soak = flags.Soak
		}
		if *withRetention {
			cfg.Retention = &chaos.Retention{}
		}
		cfg.Seed = seed
		return cfg, nil
	}

	if *profile != "mix" {
		cfg, err := configFor(*profile, seed)
		if err != nil {
			return err
		}
		res, err := runChaosOnce(ctx, cfg, stdout, stderr)
		if err != nil {
			return err
		}
		if !res.OK() {
			return errors.New("chaos: invariants violated or the system did not come to rest (see above)")
		}
		return nil
	}

	// mix: every other profile in turn, each on a fresh database with a seed derived from
	// --seed, until --duration has passed. Each profile's chaos is capped at half its share
	// of the soak, so that every profile gets its turn and the time to come to rest (a profile
	// at its own full length would take the whole soak: measured, long alone ran 6 minutes).
	soakEnd := time.Now().Add(flags.Duration)
	profiles := len(chaos.Profiles) - 2 // not classic, not mix itself
	share := max(flags.Duration/time.Duration(2*profiles), 5*time.Second)
	var failed []string
	runs := 0
	for i := 0; time.Now().Before(soakEnd); i++ {
		name := chaos.Profiles[1+i%profiles] // skip classic and mix itself
		cfg, err := configFor(name, seed+uint64(i))
		if err != nil {
			return err
		}
		cfg.Duration = min(cfg.Duration, share, max(time.Until(soakEnd), 5*time.Second))
		// Long runs live no longer than their profile's chaos, or they would still be working
		// when the run is judged for rest.
		cfg.LongLifetime = min(cfg.LongLifetime, cfg.Duration)
		// And a settle profile's date stays small enough for a soak to keep to its duration:
		// 5,000 merchants (~12k payouts) against the slow-bank profile drain at 15-20 payouts/s,
		// many minutes beyond a profile's share. (Run alone, `chaos --profile slow-bank` keeps
		// its full size: its wait for rest follows progress, see ChaosConfig.Progress.)
		if cfg.Merchants > 0 && !set["merchants"] {
			cfg.Merchants = min(cfg.Merchants, 1000)
		}
		fmt.Fprintf(stdout, "mix: run %d: profile %s seed %d for %s\n", i+1, name, cfg.Seed, cfg.Duration)
		res, err := runChaosOnce(ctx, cfg, stdout, stderr)
		if err != nil {
			return err
		}
		runs++
		if !res.OK() {
			failed = append(failed, fmt.Sprintf("%s (seed %d)", name, cfg.Seed))
		}
	}
	fmt.Fprintf(stdout, "mix: %d runs, %d failed%s\n", runs, len(failed), strings.Join(append([]string{""}, failed...), "\n  "))
	if len(failed) > 0 {
		return errors.New("chaos: invariants violated or the system did not come to rest (see above)")
	}
	return nil
}

// runChaosOnce runs one chaos profile on a fresh database and prints its summary.
func runChaosOnce(ctx context.Context, cfg *chaos.Config, stdout, stderr io.Writer) (*chaos.Result, error) {
	srv, err := pgserver.Find(ctx, &pgserver.Opts{EnvVars: []string{"DATABASE_URL"}, Logf: func(f string, a ...any) { fmt.Fprintf(stderr, f+"\n", a...) }})
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	dbURL, drop, err := freshDatabase(ctx, srv.URL, fmt.Sprintf("stepwise_chaos_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6))
	if err != nil {
		return nil, err
	}
	defer drop()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "chaos profile %s seed %d: preparing the database...\n", cfg.Profile, cfg.Seed)
	err = chaos.Prepare(ctx, pool, cfg)
	pool.Close()
	if err != nil {
		return nil, err
	}

	self, err := os.Executable()
	if err != nil {
		return nil, err
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
	return res, err
}

func runChaosWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chaos-worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, `Usage: stepwise-lab chaos-worker

One worker process of "stepwise-lab chaos", which starts it; not meant to be run by
hand. It reads DATABASE_URL, BANK_URL and the CHAOS_* settings (see chaos.WorkerMain) from the
environment and runs the settlement service until SIGTERM.`)
	}
	if err := cmdline.ParseFlags(fs, args, false); err != nil {
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
		return "", nil, fmt.Errorf("connecting to %s: %w", cmdline.RedactURL(adminURL), err)
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
