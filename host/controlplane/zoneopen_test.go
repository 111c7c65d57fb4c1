package controlplane_test

import (
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/zone"
)

// get is the body of GET http://url, or "" when there is no answer.
func get(url string) string {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// A zone's open answers (its API and diagnostics, served without a token) name no file of the
// zone's machine: a token file it cannot read and a CA that did not sign the global's certificate
// are named by their flags, with the full paths in the zone's log only. (Before: /api/zone's
// lastError showed the token file's full path.)
func TestAZonesOpenAnswersNameNoFilePaths(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	certDir := t.TempDir()
	tc, err := kds.ServerTLS("", "", certDir)
	g.Expect(err).NotTo(HaveOccurred())
	gl := startGlobal(t, openSQLite(t), reg, func(c *controlplane.GlobalConfig) { c.TLS = tc })

	secrets := t.TempDir()
	otherCA := t.TempDir()
	_, err = kds.ServerTLS("", "", otherCA) // a CA that did not sign the global's certificate
	g.Expect(err).NotTo(HaveOccurred())
	for _, tc := range []struct {
		name, says string
		cfg        func(*zone.Config)
	}{
		{"a token file it cannot read", "--zone-token-file", func(c *zone.Config) {
			c.TLSCAFile = filepath.Join(certDir, "kds.crt")
			c.TokenFile = filepath.Join(secrets, "zone-1.token") // no such file
		}},
		{"a CA that did not sign the global's certificate", "--kds-tls-ca", func(c *zone.Config) {
			c.TLSCAFile = filepath.Join(otherCA, "kds.crt")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			z := startZone(t, "zone-1", gl.KDSAddr(), openSQLite(t), reg, func(c *zone.Config) {
				c.GlobalAddress = "grpcs://" + gl.KDSAddr()
				tc.cfg(c)
			})
			g.Eventually(func() string { return get(z.APIAddr() + "/api/zone") }, 10*time.Second).Should(ContainSubstring(tc.says))
			for _, url := range []string{z.APIAddr() + "/api/zone", z.APIAddr() + "/", z.APIAddr() + "/meshes",
				z.DiagAddr() + "/readyz", z.DiagAddr() + "/metrics"} {
				body := get(url)
				g.Expect(body).NotTo(BeEmpty(), url)
				for _, dir := range []string{secrets, otherCA, certDir} {
					g.Expect(body).NotTo(ContainSubstring(dir), url)
				}
			}
		})
	}
}
