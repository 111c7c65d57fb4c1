package controlplane_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// TestReplicasShareOneListenOverTheRelay runs two replicas with the changes relay on one
// PostgreSQL database, neither polling, and a zone on the one that is not the hub:
//   - one replica is the hub, the other follows it at its KDS address;
//   - a write through the hub's store reaches the zone, heard by the follower from the hub (it
//     does not LISTEN while it follows), with what the write changed;
//   - the relay refuses a call without a token, with a zone's, and with a replica token of
//     another fleet's key; a replica token is not a zone's, nor a user's on the API; the
//     follower itself is not the hub, and says so;
//   - the hub stops: the follower is elected, and a write still reaches the zone.
func TestReplicasShareOneListenOverTheRelay(t *testing.T) {
	g, ctx := NewWithT(t), context.Background()
	reg := resource.Default()
	dsn := pg.Database(t)
	stA, stB := openPostgresAt(t, dsn), openPostgresAt(t, dsn)
	put(t, stA, reg, mesh("default"))
	relay := func(id string) func(*controlplane.GlobalConfig) {
		return func(c *controlplane.GlobalConfig) {
			c.ReplicaID, c.PollInterval, c.StoreRelay = id, time.Hour, true
		}
	}
	glA := startGlobal(t, stA, reg, relay("A"))
	g.Eventually(func() string { return stA.(store.Listener).ListenStatus().Relay }, 10*time.Second).Should(Equal(store.RelayHub))
	glB := startGlobal(t, stB, reg, relay("B"))
	statusB := func() store.ListenStatus { return stB.(store.Listener).ListenStatus() }
	g.Eventually(statusB, 10*time.Second).Should(And(HaveField("Relay", store.RelayFollower), HaveField("Hub", "grpc://"+glA.KDSAddr())))

	zst := openSQLite(t)
	startZone(t, "zone-1", glB.KDSAddr(), zst, reg)
	g.Eventually(count(zst, "", ""), 10*time.Second).Should(Equal(1))
	notified, fromLog := statusB().Notified, statusB().ChangesFromLog
	put(t, stA, reg, timeout("default", "t-00", "2s"))
	g.Eventually(specOf(zst, "t-00"), 10*time.Second).Should(ContainSubstring("2s"))
	g.Expect(statusB().Notified).To(BeNumerically(">", notified), "B heard it from the hub")
	g.Expect(statusB().ChangesFromLog).To(BeNumerically(">", fromLog), "with what it changed")
	g.Expect(statusB().Relay).To(Equal(store.RelayFollower))

	// Who may follow.
	follow := func(addr, tok string) *status.Status {
		t.Helper()
		conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		g.Expect(err).NotTo(HaveOccurred())
		defer conn.Close()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if tok != "" {
			cctx = metadata.AppendToOutgoingContext(cctx, "authorization", "Bearer "+tok)
		}
		s, err := kdsv1.NewChangesRelayClient(conn).Follow(cctx, &kdsv1.FollowRequest{Replica: "test"})
		if err == nil {
			var n *kdsv1.Notification
			if n, err = s.Recv(); err == nil {
				g.Expect(n.GetReady()).To(BeTrue())
				return status.New(codes.OK, "")
			}
		}
		return status.Convert(err)
	}
	replicaTok := token(t, auth.Claims{Kind: auth.KindReplica, Name: "test"})
	g.Expect(follow(glA.KDSAddr(), replicaTok).Code()).To(Equal(codes.OK))
	g.Expect(follow(glA.KDSAddr(), "").Code()).To(Equal(codes.Unauthenticated))
	g.Expect(follow(glA.KDSAddr(), token(t, auth.Claims{Kind: auth.KindZone, Name: "zone-1"})).Code()).To(Equal(codes.PermissionDenied))
	other, err := auth.NewKeys()
	g.Expect(err).NotTo(HaveOccurred())
	forged, err := other.Issue(auth.Claims{Kind: auth.KindReplica, Name: "test"}, time.Hour, time.Now())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(follow(glA.KDSAddr(), forged).Code()).To(Equal(codes.Unauthenticated))
	st := follow(glB.KDSAddr(), replicaTok)
	g.Expect(st.Code()).To(Equal(codes.Unavailable))
	g.Expect(st.Message()).To(ContainSubstring("not the changes relay's hub"))
	g.Expect(streamStatus(t, glA.KDSAddr(), "test", replicaTok).Code()).To(Equal(codes.PermissionDenied), "a replica token is not a zone's")
	req, err := http.NewRequest(http.MethodGet, "http://"+glA.APIAddr()+"/meshes", nil)
	g.Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer "+replicaTok)
	resp, err := http.DefaultClient.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusForbidden), "nor a user's")

	// The hub stops: B is elected, and writes still reach the zone.
	glA.stop()
	g.Eventually(statusB, 10*time.Second).Should(And(HaveField("Relay", store.RelayHub), HaveField("Listening", true)))
	put(t, stA, reg, timeout("default", "t-01", "3s"))
	g.Eventually(specOf(zst, "t-01"), 10*time.Second).Should(ContainSubstring("3s"))
}

// TestTheRelayOverTLS: replicas that serve KDS over TLS with one certificate follow the hub over
// TLS; a replica with a certificate of its own (its self-signed default) cannot verify the hub,
// says so, and listens itself, hearing every write all the same.
func TestTheRelayOverTLS(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	dsn := pg.Database(t)
	shared, err := kds.ServerTLS("", "", t.TempDir())
	g.Expect(err).NotTo(HaveOccurred())
	own, err := kds.ServerTLS("", "", t.TempDir())
	g.Expect(err).NotTo(HaveOccurred())
	replica := func(id string, tc *tls.Config) func(*controlplane.GlobalConfig) {
		return func(c *controlplane.GlobalConfig) {
			c.ReplicaID, c.PollInterval, c.StoreRelay, c.TLS = id, time.Hour, true, tc
		}
	}
	stA, stB, stC := openPostgresAt(t, dsn), openPostgresAt(t, dsn), openPostgresAt(t, dsn)
	put(t, stA, reg, mesh("default"))
	glA := startGlobal(t, stA, reg, replica("A", shared))
	g.Eventually(func() string { return stA.(store.Listener).ListenStatus().Relay }, 10*time.Second).Should(Equal(store.RelayHub))
	startGlobal(t, stB, reg, replica("B", shared))
	startGlobal(t, stC, reg, replica("C", own))
	statusOf := func(st store.Store) func() store.ListenStatus {
		return func() store.ListenStatus { return st.(store.Listener).ListenStatus() }
	}
	g.Eventually(statusOf(stB), 10*time.Second).Should(And(HaveField("Relay", store.RelayFollower), HaveField("Hub", "grpcs://"+glA.KDSAddr())))
	g.Eventually(statusOf(stC), 10*time.Second).Should(And(HaveField("Relay", ""), HaveField("Listening", true),
		HaveField("LastError", And(ContainSubstring("grpcs://"+glA.KDSAddr()), ContainSubstring("certificate")))))

	// C tries the hub again now and then, and listens in between: a write made while it tries
	// is heard by the read its LISTEN makes as it takes effect again (Polled), any other by the
	// LISTEN itself (Notified).
	heardC := func() int64 { st := statusOf(stC)(); return st.Notified + st.Polled }
	notifiedB, beforeC := statusOf(stB)().Notified, heardC()
	put(t, stA, reg, timeout("default", "t-00", "2s"))
	g.Eventually(func() int64 { return statusOf(stB)().Notified }, 10*time.Second).Should(BeNumerically(">", notifiedB), "B heard it from the hub, over TLS")
	g.Eventually(heardC, 10*time.Second).Should(BeNumerically(">", beforeC), "C heard it by its own LISTEN")
	g.Expect(statusOf(stB)().Relay).To(Equal(store.RelayFollower))
}
