package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/bankfake"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/workflow"
)

// Worker processes. The takeover and scale sections need real processes (a goroutine cannot
// be kill -9'ed), so the bench re-executes its own binary with roleEnv set; Main then runs the
// role instead of the bench. The role is the sample's Service as serve wires it, configured
// through the environment below, so the binary has no extra command to hide.
const (
	roleEnv        = "STEPWISE_BENCH_ROLE"
	workerDBEnv    = "STEPWISE_BENCH_DB"
	workerBankEnv  = "STEPWISE_BENCH_BANK"
	workerLeaseEnv = "STEPWISE_BENCH_LEASE"
	workerBatchEnv = "STEPWISE_BENCH_BATCH"
	workerSlotsEnv = "STEPWISE_BENCH_SETTLE_WORKERS"
	workerMaintEnv = "STEPWISE_BENCH_MAINTENANCE" // "every": RunMaintenance in every process; "leader": River's leader only
	roleWorker     = "worker"
)

// workerID is the River client ID of a worker process: its pid can be read back from the
// owner of a lease ("<client id>/job-N/attempt-M").
func workerID(pid int) string { return fmt.Sprintf("bench-worker-%d", pid) }

func runRole(ctx context.Context, role string, stdout, _ io.Writer) error {
	if role != roleWorker {
		return fmt.Errorf("bench: %s=%q: unknown role", roleEnv, role)
	}
	lease, err := time.ParseDuration(os.Getenv(workerLeaseEnv))
	if err != nil {
		return fmt.Errorf("bench worker: %s: %w", workerLeaseEnv, err)
	}
	batch, err := strconv.Atoi(os.Getenv(workerBatchEnv))
	if err != nil {
		return fmt.Errorf("bench worker: %s: %w", workerBatchEnv, err)
	}
	slots, err := strconv.Atoi(os.Getenv(workerSlotsEnv))
	if err != nil {
		return fmt.Errorf("bench worker: %s: %w", workerSlotsEnv, err)
	}
	// The parent holds our stdin open; when it dies, however it dies, stdin reaches EOF and
	// the worker goes too, so no worker outlives a bench.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()

	pool, err := newPool(ctx, os.Getenv(workerDBEnv), 20)
	if err != nil {
		return err
	}
	defer pool.Close()
	bank, closeIdle := bankClient(os.Getenv(workerBankEnv))
	defer closeIdle()
	svc, err := settlement.NewService(pool, &settlement.ServiceConfig{
		Bank:          bankfake.New(bank),
		BatchSize:     batch,
		SettleWorkers: slots,
		Workflow:      &workflow.Config{Lease: lease, Logger: quietLogger()},
		ID:            workerID(os.Getpid()),
		Logger:        quietLogger(),
	})
	if err != nil {
		return err
	}
	if err := svc.Start(ctx); err != nil {
		return err
	}
	// The maintenance loop of every process runs in the client's Start: "leader" no longer
	// turns it off.
	fmt.Fprintf(stdout, "ready pid=%d\n", os.Getpid())
	<-ctx.Done()
	return svc.Stop(context.Background(), 2*time.Second)
}

// workerProc is a running worker process.
type workerProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	pid   int
	done  chan struct{}
}

type workerOpts struct {
	dbURL, bankURL string
	lease          time.Duration
	batch, slots   int
	maintenance    string
}

// startWorker starts a worker process and waits until its River client runs.
func startWorker(ctx context.Context, o workerOpts) (*workerProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this binary to start a worker: %w", err)
	}
	cmd := exec.Command(exe, "bench")
	cmd.Env = append(os.Environ(),
		roleEnv+"="+roleWorker,
		workerDBEnv+"="+o.dbURL,
		workerBankEnv+"="+o.bankURL,
		workerLeaseEnv+"="+o.lease.String(),
		workerBatchEnv+"="+strconv.Itoa(o.batch),
		workerSlotsEnv+"="+strconv.Itoa(o.slots),
		workerMaintEnv+"="+o.maintenance,
	)
	// Its own process group, so a kill reaches nothing else; stderr is discarded unless it
	// fails to start (a worker killed mid-step has nothing useful to say).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	var stderrMu sync.Mutex
	cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		stderrMu.Lock()
		defer stderrMu.Unlock()
		if stderr.Len() < 4096 {
			stderr.Write(p)
		}
		return len(p), nil
	})
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting a worker process: %w", err)
	}
	w := &workerProc{cmd: cmd, stdin: stdin, pid: cmd.Process.Pid, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		signalled := false
		for sc.Scan() {
			if !signalled && strings.HasPrefix(sc.Text(), "ready ") {
				close(ready)
				signalled = true
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(w.done) }()
	select {
	case <-ready:
		return w, nil
	case <-w.done:
		stderrMu.Lock()
		defer stderrMu.Unlock()
		return nil, fmt.Errorf("worker process %d exited before it was ready: %s", w.pid, strings.TrimSpace(stderr.String()))
	case <-time.After(30 * time.Second):
		w.kill()
		return nil, errors.New("worker process not ready after 30s")
	case <-ctx.Done():
		w.kill()
		return nil, ctx.Err()
	}
}

// stop asks the worker to shut down as serve does on SIGTERM (in-flight steps and sends
// finish), and kills it if it has not exited within 15s.
func (w *workerProc) stop() {
	_ = syscall.Kill(w.pid, syscall.SIGTERM)
	select {
	case <-w.done:
		_ = w.stdin.Close()
	case <-time.After(15 * time.Second):
		w.kill()
	}
}

// kill sends SIGKILL to the worker's process group and waits for it to be gone.
func (w *workerProc) kill() {
	_ = syscall.Kill(-w.pid, syscall.SIGKILL)
	_ = w.stdin.Close()
	<-w.done
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
