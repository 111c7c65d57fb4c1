// Package replicas_test runs the replicas example (replicas.sh) with the real binaries and a real
// PostgreSQL: three global replicas, two zones, a replica killed under a zone, every LISTEN
// connection killed.
package replicas_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/store/pgtest"
	"github.com/kds-host/kds-host/internal/testbin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// TestAZoneMovesWhenItsReplicaIsKilled: kill -9 of the replica zone-1 is on; the zone connects
// to another replica, holds both writes made meanwhile, and the new replica sent it those two
// resources and nothing it had ACKed already (kds_resources_sent_total). With every LISTEN
// connection killed, a write still reaches both zones.
func TestAZoneMovesWhenItsReplicaIsKilled(t *testing.T) {
	if pgtest.Skipped() {
		t.Skipf("%s=1: skipping PostgreSQL test", pgtest.EnvSkip)
	}
	g := NewWithT(t)
	bin := filepath.Dir(testbin.Build(t, "./host/cmd/kds-host"))
	root, err := testbin.ModuleRoot()
	g.Expect(err).NotTo(HaveOccurred())
	// replicas.sh's ports: PostgreSQL at +99, replica i at +10i (+0, +1, +5), zone j at +100+10j (+0, +1).
	base := testbin.FreePortBase(t, 10, 11, 15, 20, 21, 25, 30, 31, 35, 99, 110, 111, 120, 121)
	cmd := exec.Command(filepath.Join(root, "examples/replicas/replicas.sh"), "--no-build", "--port-base", strconv.Itoa(base))
	cmd.Env = append(os.Environ(), "KDS_BIN="+bin)
	out, err := cmd.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "%s", out)
	var result map[string]string
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "RESULT "); ok {
			result = map[string]string{}
			for _, f := range strings.Fields(rest) {
				k, v, _ := strings.Cut(f, "=")
				result[k] = v
			}
		}
	}
	g.Expect(result).NotTo(BeNil(), "no RESULT line:\n%s", out)
	g.Expect(result).To(HaveKeyWithValue("moved", "yes"), "%s", out)
	g.Expect(result).To(HaveKeyWithValue("resent", "2"), "the two changed resources, nothing unchanged:\n%s", out)
	g.Expect(strconv.Atoi(result["listen_killed"])).To(Equal(2), "one listener connection per surviving replica:\n%s", out)
	g.Expect(result).To(HaveKeyWithValue("relay_hubs", "1"), "one hub of the changes relay among the survivors:\n%s", out)
}
