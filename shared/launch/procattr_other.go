//go:build !unix

package launch

import "os/exec"

// setProcAttr leaves the command as it is: there are no process groups here, and
// exec.CommandContext's default Cancel kills the plugin process.
func setProcAttr(*exec.Cmd) {}

// pinThread does nothing: without Pdeathsig the forking thread does not matter.
func pinThread() {}
