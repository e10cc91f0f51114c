package workflowtest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// TestMain runs the roles below when this binary is started as a child, and the tests
// otherwise. Other tests of this package share it.
func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) }

func init() {
	workflowtest.RegisterRole("ready-and-block", func(ctx context.Context, env map[string]string) error {
		fmt.Println("ready", env["GREETING"])
		<-ctx.Done()
		fmt.Println("got", context.Cause(ctx))
		return nil
	})
	workflowtest.RegisterRole("exit-3", func(ctx context.Context, env map[string]string) error {
		fmt.Fprintln(os.Stderr, "exiting with code 3")
		os.Exit(3)
		return nil
	})
	workflowtest.RegisterRole("fail", func(ctx context.Context, env map[string]string) error {
		fmt.Fprintln(os.Stderr, "about to fail")
		return errors.New("the role failed on purpose")
	})
	// spawner starts a grandchild with the same harness, optionally stops it, reports its
	// pid and blocks: the test then kills the spawner alone, as kill -9 of a test process
	// would, and checks that the grandchild does not outlive it.
	workflowtest.RegisterRole("spawner", func(ctx context.Context, env map[string]string) error {
		tb := &childTB{}
		grandchild := workflowtest.Start(tb, "ready-and-block")
		if _, err := grandchild.WaitForLine(ctx, "ready"); err != nil {
			return err
		}
		if env["STOP_GRANDCHILD"] == "1" {
			if err := grandchild.Stop(); err != nil {
				return err
			}
		}
		fmt.Println("grandchild", grandchild.Pid())
		<-ctx.Done()
		return nil
	})
}

func TestProcessStopContKill(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	p := workflowtest.Start(t, "ready-and-block", "GREETING=hello")
	line, err := p.WaitForLine(ctx, "ready")
	require.NoError(t, err)
	require.Equal(t, "ready hello", line, "env given to Start reaches the role")
	require.False(t, p.Exited())

	require.NoError(t, p.Stop())
	if runtime.GOOS == "linux" {
		require.Equal(t, "T", procState(t, p.Pid()), "SIGSTOP must leave the process stopped")
	}
	require.NoError(t, p.Cont())
	if runtime.GOOS == "linux" {
		require.Eventually(t, func() bool { return procState(t, p.Pid()) != "T" }, 5*time.Second, time.Millisecond)
	}

	p.Kill()
	require.True(t, p.Exited())
	var exitErr *exec.ExitError
	require.ErrorAs(t, p.Wait(), &exitErr)
	require.Equal(t, syscall.SIGKILL, exitErr.Sys().(syscall.WaitStatus).Signal())
	require.Error(t, p.Stop(), "stopping an exited process is an error")
	p.Kill() // a second Kill is a no-op
	require.Contains(t, p.Lines(), "ready hello")
}

func TestProcessGracefulSignal(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	p := workflowtest.Start(t, "ready-and-block")
	_, err := p.WaitForLine(ctx, "ready")
	require.NoError(t, err)
	require.NoError(t, p.Signal(syscall.SIGTERM))
	require.NoError(t, p.Wait(), "SIGTERM cancels the role's context and it returns nil")
	_, err = p.WaitForLine(ctx, "got ")
	require.NoError(t, err, "lines printed just before exit are not lost")
}

func TestProcessExitCode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	p := workflowtest.Start(t, "exit-3")
	err := p.Wait()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr)
	require.Equal(t, 3, exitErr.ExitCode())
	require.Contains(t, err.Error(), `role "exit-3"`)

	_, err = p.WaitForLine(ctx, "never printed")
	require.ErrorContains(t, err, `role "exit-3"`)
	require.ErrorContains(t, err, "exit status 3")
	require.ErrorContains(t, err, "exiting with code 3", "the error quotes the last stderr lines")
}

func TestProcessRoleError(t *testing.T) {
	t.Parallel()
	p := workflowtest.Start(t, "fail")
	var exitErr *exec.ExitError
	require.ErrorAs(t, p.Wait(), &exitErr)
	require.Equal(t, 1, exitErr.ExitCode())
	require.Contains(t, strings.Join(p.Lines(), "\n"), "the role failed on purpose")
}

func TestProcessUnknownRole(t *testing.T) {
	t.Parallel()
	p := workflowtest.Start(t, "no-such-role")
	var exitErr *exec.ExitError
	require.ErrorAs(t, p.Wait(), &exitErr)
	require.Equal(t, 2, exitErr.ExitCode())
	require.Contains(t, strings.Join(p.Lines(), "\n"), `role "no-such-role" is not registered`)
}

func TestProcessWaitForLineContext(t *testing.T) {
	t.Parallel()
	p := workflowtest.Start(t, "ready-and-block")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := p.WaitForLine(ctx, "never printed")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestChildDiesWithParent kills a parent process alone (SIGKILL to it, not its group) and
// checks that its child, running or stopped, does not outlive it.
func TestChildDiesWithParent(t *testing.T) {
	t.Parallel()
	for _, stopped := range []bool{false, true} {
		t.Run(fmt.Sprintf("stopped=%v", stopped), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			env := "STOP_GRANDCHILD=0"
			if stopped {
				env = "STOP_GRANDCHILD=1"
			}
			spawner := workflowtest.Start(t, "spawner", env)
			line, err := spawner.WaitForLine(ctx, "grandchild ")
			require.NoError(t, err)
			pid, err := strconv.Atoi(strings.TrimPrefix(line, "grandchild "))
			require.NoError(t, err)
			if stopped && runtime.GOOS == "linux" {
				require.Equal(t, "T", procState(t, pid))
			}

			require.NoError(t, spawner.Signal(syscall.SIGKILL))
			require.Error(t, spawner.Wait())
			require.Eventually(t, func() bool { return gone(pid) }, 10*time.Second, 5*time.Millisecond,
				"grandchild %d outlived its parent", pid)
		})
	}
}

// childTB lets a role (which runs outside any test) use Start. Start calls only Helper,
// Logf, Fatalf and Cleanup; the embedded nil TB would panic on anything else, which is
// fine for this test.
type childTB struct{ testing.TB }

func (*childTB) Helper()                      {}
func (*childTB) Logf(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }
func (*childTB) Fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", a...)
	os.Exit(1)
}
func (*childTB) Cleanup(func()) {}

// procState returns the state letter from /proc/<pid>/stat, or "" once the process is gone.
func procState(t *testing.T, pid int) string {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	i := strings.LastIndexByte(string(raw), ')')
	require.Positive(t, i)
	return string(raw[i+2])
}

// gone reports whether pid has exited; a zombie waiting for its new parent to reap it has.
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	if raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		i := strings.LastIndexByte(string(raw), ')')
		return i > 0 && i+2 < len(raw) && raw[i+2] == 'Z'
	}
	return false
}
