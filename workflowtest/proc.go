package workflowtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-go/stepwise/internal/faultpoint"
)

// RoleEnv is the environment variable that tells a re-executed test binary which role to
// run instead of its tests.
const RoleEnv = "STEPWISE_ROLE"

// lifelineEnv names the child's file descriptor of a pipe whose other end only the parent
// holds. When the parent dies (kill -9 of go test, a test timeout), the child reads EOF and
// exits, so no worker outlives the test that started it.
const lifelineEnv = "STEPWISE_LIFELINE_FD"

// stderrTailLines is how many of a child's last stderr lines an error message quotes.
const stderrTailLines = 20

var (
	rolesMu sync.Mutex
	roles   = map[string]func(ctx context.Context, env map[string]string) error{}
)

// RegisterRole makes fn runnable in a child process started by Start(t, name). Call it from
// an init function or from TestMain before RunRoleIfChild (testkit.Main calls that), so the
// child, which runs the same binary, knows the role too.
//
// fn gets a context cancelled on SIGTERM or SIGINT and the child's environment. A nil return
// exits the child with code 0, an error with code 1 after printing it to stderr.
//
// RegisterRole panics if name is empty or already registered, or fn is nil: that is a
// wiring mistake, as river.AddWorker treats one.
func RegisterRole(name string, fn func(ctx context.Context, env map[string]string) error) {
	if name == "" {
		panic("workflowtest.RegisterRole: empty role name")
	}
	if fn == nil {
		panic(fmt.Sprintf("workflowtest.RegisterRole: role %q has a nil function", name))
	}
	rolesMu.Lock()
	defer rolesMu.Unlock()
	if _, dup := roles[name]; dup {
		panic(fmt.Sprintf("workflowtest.RegisterRole: role %q registered twice", name))
	}
	roles[name] = fn
}

// RunRoleIfChild runs the role named by STEPWISE_ROLE when this process is a child started
// by Start, and reports handled=true with the exit code the process should exit with. In the
// parent (no STEPWISE_ROLE) it returns handled=false and does nothing. Call it first thing
// in TestMain:
//
//	func TestMain(m *testing.M) {
//		if handled, code := workflowtest.RunRoleIfChild(); handled {
//			os.Exit(code)
//		}
//		os.Exit(m.Run())
//	}
func RunRoleIfChild() (handled bool, code int) {
	name := os.Getenv(RoleEnv)
	if name == "" {
		return false, 0
	}
	rolesMu.Lock()
	fn := roles[name]
	names := make([]string, 0, len(roles))
	for n := range roles {
		names = append(names, n)
	}
	rolesMu.Unlock()
	if fn == nil {
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "workflowtest: role %q is not registered (registered: %s); call workflowtest.RegisterRole from init or TestMain before RunRoleIfChild\n",
			name, strings.Join(names, ", "))
		return true, 2
	}
	watchLifeline()
	// Fault points are armed only here, in a child a test started, never by a package init:
	// a production binary must ignore STEPWISE_FAULTS. A typo exits 2 rather than letting
	// the test run with nothing injected.
	if err := faultpoint.ArmFromEnv(); err != nil {
		fmt.Fprintf(os.Stderr, "workflowtest: role %q: %v\n", name, err)
		return true, 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	env := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	if err := fn(ctx, env); err != nil {
		fmt.Fprintf(os.Stderr, "workflowtest: role %q: %v\n", name, err)
		return true, 1
	}
	return true, 0
}

// watchLifeline exits this child when the parent's end of the lifeline pipe closes, which
// happens however the parent ends. A child that is SIGSTOPped when the parent dies is not
// left frozen either: its process group becomes orphaned, and the kernel then sends it
// SIGHUP (which ends a Go program) and SIGCONT.
func watchLifeline() {
	raw := os.Getenv(lifelineEnv)
	if raw == "" {
		return
	}
	fd, err := strconv.Atoi(raw)
	if err != nil || fd < 3 {
		return
	}
	// Processes this role starts must not hold the pipe: they would not keep the parent
	// alive, but they would keep the descriptor busy for nothing.
	syscall.CloseOnExec(fd)
	f := os.NewFile(uintptr(fd), "workflowtest-lifeline")
	go func() {
		io.Copy(io.Discard, f) //nolint:errcheck // returns at EOF: the parent is gone
		fmt.Fprintln(os.Stderr, "workflowtest: parent test process is gone; exiting")
		os.Exit(3)
	}()
}

// Process is a child process running one role, started by Start. Its methods are safe for
// concurrent use.
type Process struct {
	role string
	cmd  *exec.Cmd
	pid  int

	lifeline *os.File // parent's (write) end; closed once the child has exited

	mu      sync.Mutex
	lines   []string
	stderr  []string      // last stderrTailLines lines of stderr
	changed chan struct{} // closed and replaced whenever lines or the exit state change
	exited  bool          // the process has exited (and its output was drained, or 1s passed)
	waitErr error

	done    chan struct{} // closed when the process has exited and was reaped
	readers sync.WaitGroup

	logMu   sync.Mutex
	logf    func(format string, args ...any)
	logging bool // false once the test's cleanup has run: t.Logf would panic after that
}

// Start runs role in a child process: the test binary itself (os.Executable), with
// -test.run=^$ so that no test runs there, STEPWISE_ROLE=role, and env (KEY=VALUE entries)
// on top of this process's environment. The child's stdout and stderr lines are logged with
// a "[role pid]" prefix and kept for WaitForLine and Lines.
//
// The child leads its own process group, so Kill, Stop and Cont reach anything it started.
// At t's cleanup the group is killed with SIGKILL and the child reaped; if the test process
// itself dies, the child notices and exits (see RunRoleIfChild).
func Start(t testing.TB, role string, env ...string) *Process {
	t.Helper()
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			t.Fatalf("workflowtest.Start(%q): env entry %q is not KEY=VALUE", role, kv)
		}
	}
	p, err := start(role, env, t.Logf)
	if err != nil {
		t.Fatalf("workflowtest.Start(%q): %v", role, err)
	}
	t.Cleanup(p.cleanup)
	return p
}

func start(role string, env []string, logf func(string, ...any)) (*Process, error) {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating lifeline pipe: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll(lifeR, lifeW)
		return nil, fmt.Errorf("creating stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(lifeR, lifeW, outR, outW)
		return nil, fmt.Errorf("creating stderr pipe: %w", err)
	}

	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = childEnv(role, env)
	cmd.Stdout = outW
	cmd.Stderr = errW
	cmd.ExtraFiles = []*os.File{lifeR} // fd 3 in the child
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		closeAll(lifeR, lifeW, outR, outW, errR, errW)
		return nil, fmt.Errorf("starting %s: %w", exe, err)
	}
	// The child has its own copies; ours would keep the pipes open after it exits.
	closeAll(lifeR, outW, errW)

	p := &Process{
		role:     role,
		cmd:      cmd,
		pid:      cmd.Process.Pid,
		lifeline: lifeW,
		changed:  make(chan struct{}),
		done:     make(chan struct{}),
		logf:     logf,
		logging:  true,
	}
	p.readers.Add(2)
	go p.read(outR, false)
	go p.read(errR, true)
	go p.wait()
	return p, nil
}

func childEnv(role string, extra []string) []string {
	env := make([]string, 0, len(os.Environ())+len(extra)+2)
	for _, kv := range os.Environ() {
		// A child of a child must not inherit its parent's role or lifeline.
		if strings.HasPrefix(kv, RoleEnv+"=") || strings.HasPrefix(kv, lifelineEnv+"=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, RoleEnv+"="+role, lifelineEnv+"=3")
	if os.Getenv("GORACE") == "" {
		// Under -race a Go program sleeps 1s before exiting by default; a chaos test that
		// restarts workers many times would spend its time there.
		env = append(env, "GORACE=atexit_sleep_ms=0")
	}
	return append(env, extra...) // later entries win: exec.Cmd keeps the last of duplicates
}

func (p *Process) read(r *os.File, isStderr bool) {
	defer p.readers.Done()
	defer r.Close()
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			line = strings.TrimRight(line, "\r\n")
			p.mu.Lock()
			p.lines = append(p.lines, line)
			if isStderr {
				p.stderr = append(p.stderr, line)
				if len(p.stderr) > stderrTailLines {
					p.stderr = p.stderr[len(p.stderr)-stderrTailLines:]
				}
			}
			p.notifyLocked()
			p.mu.Unlock()
			p.log(line)
		}
		if err != nil {
			return
		}
	}
}

func (p *Process) log(line string) {
	p.logMu.Lock()
	defer p.logMu.Unlock()
	if p.logging {
		p.logf("[%s %d] %s", p.role, p.pid, line)
	}
}

func (p *Process) wait() {
	err := p.cmd.Wait()
	// Let the readers take what the child wrote before it died, so WaitForLine does not
	// report an exit while the line it waits for is still in the pipe. A grandchild in
	// another process group could hold the pipes open forever; do not wait for it.
	drained := make(chan struct{})
	go func() { p.readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(time.Second):
	}
	p.lifeline.Close()
	p.mu.Lock()
	p.exited = true
	if err != nil {
		p.waitErr = fmt.Errorf("role %q (pid %d): %w", p.role, p.pid, err)
	}
	p.notifyLocked()
	p.mu.Unlock()
	close(p.done)
}

func (p *Process) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// cleanup kills the group, reaps the child and stops logging before the test ends.
func (p *Process) cleanup() {
	p.Kill()
	drained := make(chan struct{})
	go func() { p.readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(2 * time.Second):
	}
	p.logMu.Lock()
	p.logging = false
	p.logMu.Unlock()
}

// Role returns the role the process runs.
func (p *Process) Role() string { return p.role }

// Pid returns the child's process id (also its process group id).
func (p *Process) Pid() int { return p.pid }

// Kill sends SIGKILL to the child's process group, as a power cut or the OOM killer would,
// and returns once the child has been reaped. Killing an exited process is a no-op.
func (p *Process) Kill() {
	if !p.Exited() {
		// The group, so that processes the role started die with it. ESRCH only means the
		// child exited in the meantime.
		syscall.Kill(-p.pid, syscall.SIGKILL) //nolint:errcheck
	}
	<-p.done
}

// Stop sends SIGSTOP to the child's process group: every thread stops, heartbeats included,
// as in a long GC pause or a frozen VM. On Linux it returns once the child is stopped.
func (p *Process) Stop() error {
	if err := p.signalGroup(syscall.SIGSTOP); err != nil {
		return err
	}
	if runtime.GOOS != "linux" {
		return nil
	}
	// Signals are delivered asynchronously; a test that pauses a worker and then acts must
	// not act while the worker still runs.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		state, err := procState(p.pid)
		if err != nil || state == 'T' || state == 't' {
			return nil
		}
		if p.Exited() {
			return fmt.Errorf("role %q (pid %d) exited instead of stopping", p.role, p.pid)
		}
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("role %q (pid %d) did not stop within 5s", p.role, p.pid)
}

// Cont sends SIGCONT to the child's process group, waking it from Stop.
func (p *Process) Cont() error { return p.signalGroup(syscall.SIGCONT) }

// Signal sends sig to the child process only (not its group), e.g. syscall.SIGTERM for a
// graceful shutdown.
func (p *Process) Signal(sig os.Signal) error {
	if p.Exited() {
		return fmt.Errorf("role %q (pid %d) has exited", p.role, p.pid)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signalling role %q (pid %d): %w", p.role, p.pid, err)
	}
	return nil
}

func (p *Process) signalGroup(sig syscall.Signal) error {
	if p.Exited() {
		return fmt.Errorf("role %q (pid %d) has exited", p.role, p.pid)
	}
	if err := syscall.Kill(-p.pid, sig); err != nil {
		return fmt.Errorf("sending %v to role %q (pid %d): %w", sig, p.role, p.pid, err)
	}
	return nil
}

// Wait waits for the child to exit and returns nil for exit code 0, else an error wrapping
// the *exec.ExitError (errors.As gives the code or the signal).
func (p *Process) Wait() error {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// Exited reports whether the child has exited and been reaped.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// WaitForLine returns the first line of the child's stdout or stderr, printed before or
// after the call, that contains substr. It fails if ctx ends first, or if the child exits
// without printing one; that error names the role and quotes its last stderr lines.
func (p *Process) WaitForLine(ctx context.Context, substr string) (string, error) {
	next := 0
	for {
		p.mu.Lock()
		for ; next < len(p.lines); next++ {
			if strings.Contains(p.lines[next], substr) {
				line := p.lines[next]
				p.mu.Unlock()
				return line, nil
			}
		}
		exited, waitErr, changed := p.exited, p.waitErr, p.changed
		tail := strings.Join(p.stderr, "\n")
		ranTests := slices.Contains(p.lines, "PASS")
		p.mu.Unlock()

		if exited {
			status := "with code 0"
			if waitErr != nil {
				status = "(" + errors.Unwrap(waitErr).Error() + ")"
			}
			hint := ""
			if ranTests {
				// The child ran the (empty) test list instead of the role.
				hint = "; it ran tests instead of the role: TestMain must call workflowtest.RunRoleIfChild (or testkit.Main) first"
			}
			return "", fmt.Errorf("role %q (pid %d) exited %s before printing a line containing %q%s; last stderr lines:\n%s",
				p.role, p.pid, status, substr, hint, tail)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for role %q (pid %d) to print a line containing %q: %w", p.role, p.pid, substr, ctx.Err())
		}
	}
}

// Lines returns every line the child has printed so far, stdout and stderr interleaved in
// the order they were read.
func (p *Process) Lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// procState returns the state letter of /proc/<pid>/stat (Linux): R, S, T, Z...
func procState(pid int) (byte, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name in parentheses may itself contain spaces or parentheses.
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 || i+2 >= len(raw) {
		return 0, fmt.Errorf("unexpected /proc/%d/stat: %q", pid, raw)
	}
	return raw[i+2], nil
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		f.Close()
	}
}
