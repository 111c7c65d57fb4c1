package controlplane_test

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/zone"
)

const adsMethod = `grpc_method="/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"`

// A write through the API is measured at every step, on a real global and zone: the API request
// by route and code, the store operations, each response's send to its ACK by kind, and the
// write to the last zone's ACK; a zone stream refused is counted by its gRPC code.
func TestAWriteIsMeasuredFromTheAPIToTheLastZonesACK(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gl := startGlobal(t, openSQLite(t), reg)
	zst := openSQLite(t)
	z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg)
	global, zoneDiag := gl.DiagAddr(), z.DiagAddr()
	g.Eventually(sampleOf(t, global, "kds_zone_connected", `zone="zone-1"`), 10*time.Second).Should(Equal(1.0))
	v, ok := sample(t, global, "kds_grpc_server_handled_total", `grpc_code="Unauthenticated",`+adsMethod)
	g.Expect(ok).To(BeTrue(), "exported at 0 before the first")
	g.Expect(v).To(BeZero())

	code, body := call(t, gl, http.MethodPut, "/meshes/default", `{}`)
	g.Expect(code).To(Equal(http.StatusCreated), body)
	g.Eventually(count(zst, "Mesh", ""), 10*time.Second).Should(Equal(1))

	g.Expect(sampleOf(t, global, "kds_api_request_seconds_count", `code="201",route="PUT /{plural}/{name}"`)()).To(Equal(1.0))
	g.Expect(sampleOf(t, global, "kds_store_operation_seconds_count", `operation="write",result="ok"`)()).To(BeNumerically(">=", 1))
	g.Expect(sampleOf(t, zoneDiag, "kds_store_operation_seconds_count", `operation="apply",result="ok"`)()).To(BeNumerically(">=", 1))
	g.Eventually(sampleOf(t, global, "kds_response_ack_seconds_count", `kind="Mesh"`), 10*time.Second).Should(BeNumerically(">=", 1))
	g.Eventually(sampleOf(t, global, "kds_convergence_seconds_count", ""), 10*time.Second).Should(BeNumerically(">=", 1), "the Mesh and its defaults, ACKed by the only zone")
	g.Expect(sampleOf(t, global, "kds_convergence_dropped_total", "")()).To(BeZero())

	code, _ = call(t, gl, http.MethodGet, "/meshes/default/meshtimeouts/absent", "")
	g.Expect(code).To(Equal(http.StatusNotFound))
	g.Expect(sampleOf(t, global, "kds_api_request_seconds_count", `code="404",route="GET /meshes/{mesh}/{plural}/{name}"`)()).To(Equal(1.0))
	resp, err := http.Get("http://" + z.APIAddr() + "/meshes") // the zone's API is measured too
	g.Expect(err).NotTo(HaveOccurred())
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	g.Expect(sampleOf(t, zoneDiag, "kds_api_request_seconds_count", `code="200",route="GET /{plural}"`)()).To(Equal(1.0))

	bad := filepath.Join(t.TempDir(), "bad.token")
	g.Expect(os.WriteFile(bad, []byte("kds1.not-a-token\n"), 0o600)).To(Succeed())
	startZone(t, "zone-2", gl.KDSAddr(), openSQLite(t), reg, func(c *zone.Config) { c.TokenFile = bad })
	g.Eventually(sampleOf(t, global, "kds_grpc_server_handled_total", `grpc_code="Unauthenticated",`+adsMethod), 10*time.Second).Should(BeNumerically(">=", 1))
}
