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
// no acknowledged write is lost or duplicated, and every zone ends equal to the global. Seed 153's
// schedule starts slow zones (here two a replica, lighter than make chaos's) and injects a bad row.
func TestAShortSoakLosesNothing(t *testing.T) {
	if pgtest.Skipped() {
		t.Skipf("%s=1: skipping PostgreSQL test", pgtest.EnvSkip)
	}
	var bin string
	for _, pkg := range []string{"./host/cmd/kds-host", "./plugins/retry-forcer", "./plugins/owner-check"} {
		bin = filepath.Dir(testbin.Build(t, pkg))
	}
	rep, err := run(config{Duration: 30 * time.Second, Seed: 153, Zones: 3, Bin: bin, Verbose: testing.Verbose(),
		SlowZones: 2, SlowZoneHold: 5 * time.Second, BigBytes: 4 << 20, BadRows: true})
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
	if rep.slow.started == 0 || rep.bad.labels+rep.bad.owners == 0 {
		t.Errorf("the schedule started %d slow zones and broke %d rows: it should do both", rep.slow.started, rep.bad.labels+rep.bad.owners)
	}
}
