// Command ignores-shutdown is a broken RetryForcer fixture: when the host asks it to shut down,
// Serve returns, but main goes on "flushing" forever and ignores SIGTERM and SIGINT.
package main

import (
	"os/signal"
	"syscall"
	"time"

	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/conformance/testdata/fixture"
)

func main() {
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT)
	shared.ServeRetryForcer(fixture.New("ignores-shutdown"))
	for {
		time.Sleep(time.Hour) // flushing something that never ends
	}
}
