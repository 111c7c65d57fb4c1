//go:build linux

package conformance

import (
	"os/exec"
	"syscall"
)

// ownProcessGroup starts cmd in a process group of its own, so that what the plugin starts can be
// found (and cleaned up) after the plugin is gone and its children have a new parent. The plugin
// dies with the suite, as it dies with the host.
func ownProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
