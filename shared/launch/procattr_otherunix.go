//go:build unix && !linux

package launch

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes a plugin lead its own process group, so that a kill reaches what it
// started too; Cancel kills the whole group. There is no Pdeathsig here.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return killGroup(cmd) }
}

// pinThread does nothing: without Pdeathsig the forking thread does not matter.
func pinThread() {}
