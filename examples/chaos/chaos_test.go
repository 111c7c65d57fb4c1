package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kds-host/kds-host/host/store/pgtest"
	"github.com/kds-host/kds-host/internal/testbin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// A short seeded soak (make test's; make chaos runs the long one): under 30 s of random faults,
// no acknowledged write is lost or duplicated, and every zone ends equal to the global.
func TestAShortSoakLosesNothing(t *testing.T) {
	if pgtest.Skipped() {
		t.Skipf("%s=1: skipping PostgreSQL test", pgtest.EnvSkip)
	}
	var bin string
	for _, pkg := range []string{"./host/cmd/kds-host", "./plugins/retry-forcer", "./plugins/owner-check"} {
		bin = filepath.Dir(testbin.Build(t, pkg))
	}
	rep, err := run(config{Duration: 30 * time.Second, Seed: 1, Zones: 3, Bin: bin, Verbose: testing.Verbose()})
	if rep != nil {
		t.Log("\n" + rep.table())
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.problems() {
		t.Error(p)
	}
	if rep.acked == 0 {
		t.Error("no write was acknowledged: the soak tested nothing")
	}
}
