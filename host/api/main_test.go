package api_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/kds-host/kds-host/host/store/pgtest"
)

// pg is the package's PostgreSQL server, started by the first test that needs it.
var pg pgtest.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	if err := pg.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = max(code, 1)
	}
	os.Exit(code)
}
