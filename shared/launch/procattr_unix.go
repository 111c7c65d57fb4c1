//go:build unix

package launch

import (
	"os/exec"
	"syscall"
)

// killGroup SIGKILLs the process group that cmd's process leads, or the process alone when
// that fails. exec calls Cancel only before it has reaped the process, so the group still
// exists and still is the plugin's.
func killGroup(cmd *exec.Cmd) error {
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err == nil {
		return nil
	}
	return cmd.Process.Kill()
}
