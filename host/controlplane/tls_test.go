package controlplane_test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/zone"
)

func TestKDSOverTLSWithASelfSignedCertificate(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	dir := t.TempDir()
	tc, err := kds.ServerTLS("", "", dir)
	g.Expect(err).NotTo(HaveOccurred())
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	gl := startGlobal(t, gst, reg, func(c *controlplane.GlobalConfig) { c.TLS = tc })

	// Probes: diagnostics and grpc.health.v1 on the KDS port (the zone checks it before it
	// opens its stream).
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		g.Eventually(func() int {
			resp, err := http.Get("http://" + gl.DiagAddr() + path)
			if err != nil {
				return 0
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}, 5*time.Second).Should(Equal(http.StatusOK), path)
	}

	zst := openSQLite(t)
	z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg, func(c *zone.Config) {
		c.GlobalAddress = "grpcs://" + gl.KDSAddr()
		c.TLSCAFile = filepath.Join(dir, "kds.crt")
	})
	g.Eventually(count(zst, "Mesh", ""), 10*time.Second).Should(Equal(1))
	g.Expect(z.Client.Stats().Connected).To(BeTrue())

	// A zone that does not trust the certificate never connects, and says why.
	bad := startZone(t, "zone-2", gl.KDSAddr(), openSQLite(t), reg, func(c *zone.Config) {
		c.GlobalAddress = "grpcs://" + gl.KDSAddr()
	})
	g.Eventually(func() string { return bad.Client.Stats().LastError }, 10*time.Second).Should(ContainSubstring("certificate"))
	g.Expect(bad.Client.Stats().Connected).To(BeFalse())
	g.Expect(bad.Client.Stats().LastError).To(And(ContainSubstring("tls/kds.crt"), ContainSubstring("--kds-tls-ca")), "it says where the certificate is and which flag takes it")
}

func TestAZoneKeepsItsDataAcrossRestarts(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	put(t, gst, reg, timeout("default", "a", "1s"))
	gl := startGlobal(t, gst, reg)
	dir := t.TempDir()
	open := func() store.Store {
		st, err := store.Open(context.Background(), "", dir)
		g.Expect(err).NotTo(HaveOccurred())
		return st
	}
	st := open()
	z := startZone(t, "zone-1", gl.KDSAddr(), st, reg)
	g.Eventually(count(st, "", ""), 10*time.Second).Should(Equal(2))
	sentBefore := kindInsight(gl.Global, "zone-1", "MeshTimeout").Sent
	z.stop()
	g.Expect(st.Close()).To(Succeed())

	st2 := open()
	defer st2.Close()
	g.Expect(count(st2, "", "")()).To(Equal(2), "the data survived the restart")
	z2 := startZone(t, "zone-1", gl.KDSAddr(), st2, reg)
	g.Eventually(func() bool { return z2.Client.Stats().Connected }, 10*time.Second).Should(BeTrue())
	put(t, gst, reg, timeout("default", "b", "1s"))
	g.Eventually(count(st2, "", ""), 10*time.Second).Should(Equal(3))
	// It reported what it had ACKed, so nothing it had was sent again.
	g.Expect(kindInsight(gl.Global, "zone-1", "MeshTimeout").Sent).To(Equal(sentBefore + 1))
}
