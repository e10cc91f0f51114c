//go:build !linux

package workflowtest

import "syscall"

// childAttr puts the child in a process group of its own; without Linux's parent-death
// signal, the lifeline pipe alone ends it when the parent dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
