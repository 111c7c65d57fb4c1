//go:build !linux

package plugins

import "os/exec"

// setProcAttr leaves the command as it is: Pdeathsig and a kill of the process group are Linux
// only here. exec.CommandContext's default Cancel kills the plugin process.
func setProcAttr(*exec.Cmd) {}

// pinThread does nothing: without Pdeathsig the forking thread does not matter.
func pinThread() {}
