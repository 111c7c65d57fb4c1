// Command leaves-child is a broken RetryForcer fixture: it starts a helper process that outlives
// it (no Pdeathsig, never stopped), so killing the plugin leaves an orphan behind.
package main

import (
	"os"
	"os/exec"
	"time"

	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/conformance/testdata/fixture"
)

const helperEnv = "LEAVES_CHILD_HELPER"

func main() {
	if os.Getenv(helperEnv) != "" {
		time.Sleep(10 * time.Minute) // the helper: outlives the plugin
		return
	}
	self, err := os.Executable()
	if err != nil {
		panic(err)
	}
	helper := exec.Command(self)
	helper.Env = append(os.Environ(), helperEnv+"=1")
	if err := helper.Start(); err != nil {
		panic(err)
	}
	shared.ServeRetryForcer(fixture.New("leaves-child"))
}
