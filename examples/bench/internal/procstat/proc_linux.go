package procstat

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill cmd when this program dies, however it dies.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
