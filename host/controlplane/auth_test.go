package controlplane_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
)

// dial opens a raw delta stream to the global as node id node, with token (none when empty),
// sends the first request, and returns the status the stream ends with.
func streamStatus(t *testing.T, kdsAddr, node, tok string) *status.Status {
	t.Helper()
	conn, err := grpc.NewClient(kdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if tok != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	}
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		return status.Convert(err)
	}
	// A Send error is io.EOF when the server ended the stream first (a refusal at stream open):
	// the status is then Recv's, as gRPC documents.
	_ = s.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: node}, TypeUrl: "Mesh"})
	for {
		if _, err := s.Recv(); err != nil {
			return status.Convert(err)
		}
	}
}

func TestImpostorsAreRefused(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	gl := startGlobal(t, gst, reg)
	real := startZone(t, "zone-1", gl.KDSAddr(), openSQLite(t), reg)
	g.Eventually(func() bool { return real.Client.Stats().Connected }, 10*time.Second).Should(BeTrue())

	st := streamStatus(t, gl.KDSAddr(), "zone-1", "")
	g.Expect(st.Code()).To(Equal(codes.Unauthenticated))
	g.Expect(st.Message()).To(ContainSubstring("kds-host token zone --name"))

	st = streamStatus(t, gl.KDSAddr(), "zone-1", token(t, auth.Claims{Kind: auth.KindZone, Name: "zone-2"}))
	g.Expect(st.Code()).To(Equal(codes.PermissionDenied))
	g.Expect(st.Message()).To(ContainSubstring(`node.id "zone-1" is not the zone "zone-2"`))

	expired, err := testKeys().Issue(auth.Claims{Kind: auth.KindZone, Name: "zone-1"}, time.Minute, time.Now().Add(-time.Hour))
	g.Expect(err).NotTo(HaveOccurred())
	st = streamStatus(t, gl.KDSAddr(), "zone-1", expired)
	g.Expect(st.Code()).To(Equal(codes.Unauthenticated))
	g.Expect(st.Message()).To(ContainSubstring("expired"))

	st = streamStatus(t, gl.KDSAddr(), "zone-1", adminToken(t))
	g.Expect(st.Code()).To(Equal(codes.PermissionDenied))
	g.Expect(st.Message()).To(ContainSubstring("not a zone token"))

	other, _ := auth.NewKeys()
	forged, _ := other.Issue(auth.Claims{Kind: auth.KindZone, Name: "zone-1"}, time.Hour, time.Now())
	st = streamStatus(t, gl.KDSAddr(), "zone-1", forged)
	g.Expect(st.Code()).To(Equal(codes.Unauthenticated))

	g.Expect(metric(t, gl.DiagAddr(), "kds_stream_refusals_total")).To(Equal(5.0))
	// The real zone never noticed.
	g.Expect(real.Client.Stats().Sessions).To(Equal(1))
	put(t, gst, reg, timeout("default", "after", "1s"))
	g.Eventually(count(real.Store, "MeshTimeout", "default"), 10*time.Second).Should(Equal(1))
}

// A second zone with a valid token for the same name replaces the first, explicitly: the old
// stream ends with a status saying why, and the new one gets every update.
func TestADuplicateZoneReplacesTheOldStream(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	gl := startGlobal(t, gst, reg)
	first := startZone(t, "zone-1", gl.KDSAddr(), openSQLite(t), reg)
	g.Eventually(count(first.Store, "Mesh", ""), 10*time.Second).Should(Equal(1))

	// The raw stream ends when the real zone reconnects and replaces it; run it in the background.
	done := make(chan *status.Status, 1)
	go func() {
		done <- streamStatus(t, gl.KDSAddr(), "zone-1", token(t, auth.Claims{Kind: auth.KindZone, Name: "zone-1"}))
	}()
	g.Eventually(func() string { return first.Client.Stats().LastError }, 10*time.Second).Should(ContainSubstring("replaced by a newer one"))
	// The first zone reconnects (its backoff) and replaces the raw one in turn.
	var st *status.Status
	g.Eventually(done, 10*time.Second).Should(Receive(&st))
	g.Expect(st.Code()).To(Equal(codes.Aborted))
	g.Expect(st.Message()).To(ContainSubstring(`this stream of node "zone-1" was replaced`))

	second := startZone(t, "zone-1", gl.KDSAddr(), openSQLite(t), reg)
	g.Eventually(count(second.Store, "Mesh", ""), 10*time.Second).Should(Equal(1))
	first.stop()
	put(t, gst, reg, timeout("default", "later", "2s"))
	g.Eventually(count(second.Store, "MeshTimeout", "default"), 10*time.Second).Should(Equal(1), "the newest stream gets every update")
	g.Expect(metric(t, gl.DiagAddr(), "kds_stream_refusals_total")).To(BeNumerically(">=", 2))
	views := gl.ZoneViews()
	g.Expect(views).To(HaveLen(1), "one zone, one entry")
}

func TestTheAPINeedsATokenOfTheRightGroup(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gl := startGlobal(t, openSQLite(t), reg)
	base := "http://" + gl.APIAddr()
	do := func(method, path, tok, body string) (int, string) {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		g.Expect(err).NotTo(HaveOccurred())
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		return resp.StatusCode, b.String()
	}
	reader := token(t, auth.Claims{Kind: auth.KindUser, Name: "ops", Groups: []string{auth.GroupReadOnly}})
	admin := adminToken(t)
	meshDoc := `{"type":"Mesh","name":"default"}`

	code, body := do(http.MethodPut, "/meshes/default", "", meshDoc)
	g.Expect(code).To(Equal(http.StatusUnauthorized))
	g.Expect(body).To(ContainSubstring("admin.token"))
	code, _ = do(http.MethodGet, "/api/zones", "", "")
	g.Expect(code).To(Equal(http.StatusUnauthorized))
	code, _ = do(http.MethodGet, "/", "", "")
	g.Expect(code).To(Equal(http.StatusOK), "the index stays open")

	code, body = do(http.MethodPut, "/meshes/default", reader, meshDoc)
	g.Expect(code).To(Equal(http.StatusForbidden))
	g.Expect(body).To(ContainSubstring("may only read"))
	code, _ = do(http.MethodGet, "/api/zones", reader, "")
	g.Expect(code).To(Equal(http.StatusOK))
	code, _ = do(http.MethodPost, "/api/tokens/zone", reader, `{"name":"zone-9"}`)
	g.Expect(code).To(Equal(http.StatusForbidden))

	code, body = do(http.MethodPut, "/meshes/default", admin, meshDoc)
	g.Expect(code).To(Equal(http.StatusCreated), body)
	code, body = do(http.MethodPost, "/api/tokens/zone", admin, `{"name":"zone-9","validFor":"1h"}`)
	g.Expect(code).To(Equal(http.StatusOK), body)
	g.Expect(body).To(ContainSubstring(`"token": "kds1.`))

	zoneTok := token(t, auth.Claims{Kind: auth.KindZone, Name: "zone-1"})
	code, body = do(http.MethodGet, "/meshes", zoneTok, "")
	g.Expect(code).To(Equal(http.StatusForbidden))
	g.Expect(body).To(ContainSubstring("not for the API"))
}

// A global that comes back with another store (its database lost) would have the zone delete
// everything: the zone keeps what it holds, says why, and syncs again only once accepted.
func TestAZoneKeepsItsDataWhenTheGlobalComesBackWithAnotherStore(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	put(t, gst, reg, timeout("default", "t", "1s"))
	gl := startGlobal(t, gst, reg)
	zst := openSQLite(t)
	z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg)
	g.Eventually(count(zst, "", ""), 10*time.Second).Should(Equal(2))
	z.stop()
	gl.stop()

	// A new, empty store behind a global on the same address.
	lost := startGlobal(t, openSQLite(t), reg, func(c *controlplane.GlobalConfig) { c.KDSAddr = gl.KDSAddr() })
	z2 := startZone(t, "zone-1", lost.KDSAddr(), zst, reg)
	g.Eventually(func() string { return z2.Client.Stats().Blocked }, 10*time.Second).Should(ContainSubstring("now serves another store"))
	g.Consistently(count(zst, "", ""), 500*time.Millisecond).Should(Equal(2), "nothing deleted")
	g.Expect(z2.Client.Stats().Connected).To(BeFalse())

	// The operator confirms: the zone syncs from the new store (and so holds nothing now).
	resp, err := http.Post("http://"+z2.APIAddr()+"/api/zone/accept-global", "application/json", nil)
	g.Expect(err).NotTo(HaveOccurred())
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	g.Eventually(count(zst, "", ""), 10*time.Second).Should(BeZero())
	g.Expect(z2.Client.Stats().Blocked).To(BeEmpty())
}
