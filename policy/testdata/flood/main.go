// Command flood is a test fixture: the reference RetryForcer, which logs FLOOD_LINES lines at
// Info (hclog JSON on stderr, as a plugin's log reaches the host) as fast as it can from the
// moment it starts. The host must allow FLOOD_LINES for it to see the variable.
package main

import (
	"os"
	"strconv"

	"github.com/hashicorp/go-hclog"

	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
	"github.com/kds-host/kds-host/shared"
)

func main() {
	n, _ := strconv.Atoi(os.Getenv("FLOOD_LINES"))
	// Made before Serve, which points os.Stderr elsewhere: this logger writes to the stderr the
	// host reads the plugin's log from.
	log := hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Info, JSONFormat: true})
	go func() {
		for i := range n {
			log.Info("flood", "line", i)
		}
	}()
	shared.ServeRetryForcer(retrypolicy.New())
}
