//go:build !linux

package procstat

import "os/exec"

// setDeathSignal does nothing here: only Linux has Pdeathsig (and /proc, which the figures
// need); a child still stops when its standard input closes.
func setDeathSignal(*exec.Cmd) {}
