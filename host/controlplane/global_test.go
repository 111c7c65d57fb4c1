package controlplane_test

import (
	"net"
	"net/http"
	"testing"

	. "github.com/onsi/gomega"
	"go.uber.org/goleak"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

// Defect 3: NewGlobal left the owner holds' worker (and the retry scheduler) running when a
// later step failed.
func TestAGlobalThatFailsToStartLeavesNothingRunning(t *testing.T) {
	g := NewWithT(t)
	st := openSQLite(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	defer taken.Close()
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	for _, addrs := range [][3]string{
		{taken.Addr().String(), "127.0.0.1:0", "127.0.0.1:0"},
		{"127.0.0.1:0", taken.Addr().String(), "127.0.0.1:0"},
		{"127.0.0.1:0", "127.0.0.1:0", taken.Addr().String()},
	} {
		_, err := controlplane.NewGlobal(controlplane.GlobalConfig{
			Store: st, Registry: resource.Default(), Builtin: retrypolicy.New(), OwnerHolds: true,
			KDSAddr: addrs[0], APIAddr: addrs[1], DiagAddr: addrs[2],
		})
		g.Expect(err).To(MatchError(ContainSubstring("listen")))
	}
	_, err = controlplane.NewGlobal(controlplane.GlobalConfig{
		Store: st, Registry: resource.Default(), Builtin: retrypolicy.New(), OwnerHolds: true, Emulate: "sleepy",
		KDSAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0", DiagAddr: "127.0.0.1:0",
	})
	g.Expect(err).To(MatchError(ContainSubstring(`emulate "sleepy"`)))
}

// The Go profiles are on the diagnostics address only when asked for.
func TestProfilesAreServedOnlyWhenAsked(t *testing.T) {
	g := NewWithT(t)
	for _, on := range []bool{false, true} {
		gl := startGlobal(t, openSQLite(t), resource.Default(), func(c *controlplane.GlobalConfig) { c.Profiles = on })
		resp, err := http.Get("http://" + gl.DiagAddr() + "/debug/pprof/")
		g.Expect(err).NotTo(HaveOccurred())
		resp.Body.Close()
		want := http.StatusNotFound
		if on {
			want = http.StatusOK
		}
		g.Expect(resp.StatusCode).To(Equal(want))
	}
}
