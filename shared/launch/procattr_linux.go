package launch

import (
	"os/exec"
	"runtime"
	"syscall"
)

// setProcAttr makes a plugin die with its parent and lead its own process group.
//
// Pdeathsig: the kernel SIGKILLs the plugin when its parent dies, even by SIGKILL, which no
// deferred cleanup survives. Setpgid: the plugin leads a process group, so a kill reaches what it
// started too (a shell-script plugin's children would otherwise hold its stdout open, and
// go-plugin's Kill would wait on them forever). Cancel is how exec.CommandContext kills: the
// whole group, by SIGKILL.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return killGroup(cmd) }
}

// pinThread locks the calling goroutine to its OS thread and never unlocks it.
//
// Linux sends Pdeathsig when the thread that forked the child exits, not when the process does
// (prctl(2): "the parent" is the creating thread). Go ends a thread when a goroutine locked to
// it exits without unlocking; if the forking thread were shared with other goroutines, one of
// them (any library that locks a thread) could end it, and the plugin would be SIGKILLed with its
// parent alive. So each plugin is forked by its keeper goroutine on a thread that goroutine holds
// until the plugin is gone; when the keeper returns, the thread ends with it, which is harmless
// by then.
func pinThread() { runtime.LockOSThread() }
