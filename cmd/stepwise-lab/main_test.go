package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

func TestMain(m *testing.M) {
	code := testkit.Main(m)
	if builtPath != "" { // the binary runBuilt made
		os.RemoveAll(filepath.Dir(builtPath))
	}
	os.Exit(code)
}

// full reports whether the README's long commands run at the size the README gives
// (STEPWISE_FULL=1); otherwise they run bounded, on every CI run.
func full() bool { return os.Getenv("STEPWISE_FULL") != "" }

// result is what one command printed and how it exited.
type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs a command in this process, as main would, with a context the test owns.
func runCLI(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := prog.Run(ctx, args, &out, &errOut)
	r := result{code: code, stdout: out.String(), stderr: errOut.String()}
	t.Logf("stepwise-lab %s → exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, r.stdout, r.stderr)
	return r
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a command's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var (
	builtOnce sync.Once
	builtPath string
	builtErr  error
)

// runBuilt runs this command as a user does: `go build` of this package (once per test
// process), then the binary with args and env on top of this process's environment. It
// returns the combined output. chaos and bench re-execute their own binary as worker
// processes, so they run here as the built command, not in the test binary.
func runBuilt(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	builtOnce.Do(func() {
		dir, err := os.MkdirTemp("", "stepwise-lab-bin-")
		if err != nil {
			builtErr = err
			return
		}
		builtPath = filepath.Join(dir, "stepwise-lab")
		out, err := exec.Command("go", "build", "-o", builtPath, ".").CombinedOutput()
		if err != nil {
			builtErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if builtErr != nil {
		t.Fatal(builtErr)
	}
	// The command is killed only when it stops printing (its progress lines) for stall, or
	// after an overall bound: a loaded machine slows it, and only a stuck command fails.
	stall, limit := 3*time.Minute, 30*time.Minute
	if full() {
		limit = 3 * time.Hour
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, builtPath, args...)
	cmd.Env = append(os.Environ(), env...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	for lastLen, lastMoved := -1, time.Now(); ; {
		select {
		case err = <-done:
		case <-time.After(time.Second):
			if n := len(out.String()); n != lastLen {
				lastLen, lastMoved = n, time.Now()
			} else if time.Since(lastMoved) > stall {
				cancel()
				t.Errorf("stepwise-lab %s printed nothing for %s; killed", strings.Join(args, " "), stall)
			}
			continue
		}
		break
	}
	t.Logf("stepwise-lab %s → %v\n%s", strings.Join(args, " "), err, out.String())
	return out.String(), err
}

func truncateForLog(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}
