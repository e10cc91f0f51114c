package workflowtest

import "syscall"

// childAttr puts the child in a process group of its own (so Stop, Cont and Kill reach it and
// whatever it starts) and has the kernel SIGKILL it when its parent dies. The lifeline pipe
// ends a running child however the parent ends; only SIGKILL ends a child that is SIGSTOPped
// at that moment. (The orphaned-process-group rule would send it SIGHUP and SIGCONT, but a
// SIGHUP inherited as ignored — a test run under nohup — leaves it alive, and one CI run
// left a stopped grandchild behind.) The signal follows the thread that forked; Go ends a
// thread only when a goroutine exits while locked to it, which the harness never does.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
