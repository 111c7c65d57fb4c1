package xdstest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	RemoveBuiltClient()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// stockRun runs scenario s against a fresh stock server and logs what it counted.
func stockRun(t *testing.T, s func(context.Context, Server, Options) (*Result, error)) (*Result, *Stock) {
	t.Helper()
	srv, err := NewStock()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s(ctx, srv, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: ready=%v observed=%v nacks=%v (%.0f/s) responses=%v delivered=%v (%d) not-responding=%d\n  %s",
		res.Scenario, res.Ready, res.Observed.Round(time.Millisecond), short4(res.NACKs), res.NACKsPerSecond, short4(res.Responses),
		res.Delivered, res.DeliveredRPCs, srv.NotResponding(), res.RPCs)
	for _, r := range res.CSDS {
		t.Logf("  csds %s %s %s v=%q nack=%q", short(r.TypeURL), r.Name, r.Status, r.Version, r.NACK)
	}
	if n := len(res.NACKMessages); n > 0 {
		t.Logf("  last NACK: %s", res.NACKMessages[n-1])
	}
	for _, n := range res.Notes {
		t.Logf("  note: %s", n)
	}
	if !res.Ready {
		t.Fatalf("the client never got ready: %v", res.Notes)
	}
	return res, srv
}

func short4(m map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[short(k)] = v
	}
	return out
}

// Stock, scenario 1: every CDS response holds the refused cluster, the client NACKs it with
// version "" (it never accepted a CDS version), the cache sees a version other than the snapshot's
// and answers again at once: a NACK storm. The good route keeps working and an endpoint move of the
// good cluster still reaches the client.
func TestStockScenario1RefusedCluster(t *testing.T) {
	t.Parallel()
	res, _ := stockRun(t, Scenario1RefusedCluster)
	if n := res.NACKs[ClusterType]; n <= 100 {
		t.Errorf("CDS NACKs = %d in %v, want > 100 (a NACK storm)", n, res.Observed)
	}
	if !res.Delivered {
		t.Errorf("the endpoint move of the good cluster was not delivered: %s", res.RPCs)
	}
	if r, ok := Find(res.CSDS, ClusterType, "bad"); !ok || r.Status != "NACKED" || !strings.Contains(r.NACK, "MAGLEV") {
		t.Errorf("CSDS of cluster bad = %+v (found %v), want NACKED with a MAGLEV error", r, ok)
	}
	if res.RPCs.RPCs == 0 {
		t.Error("no RPCs counted")
	}
}

// Stock, scenario 2: the switches all land (the last cluster serves) with no NACK; what fails
// mid-switch is logged by kind.
func TestStockScenario2RouteSwitches(t *testing.T) {
	t.Parallel()
	res, _ := stockRun(t, Scenario2RouteSwitches)
	t.Logf("failure kinds: %v", res.RPCs.Kinds())
	if !res.Delivered {
		t.Errorf("the last cluster's backend served no RPC: %s", res.RPCs)
	}
	if n := res.NACKs[ListenerType] + res.NACKs[RouteType] + res.NACKs[ClusterType] + res.NACKs[EndpointType]; n != 0 {
		t.Errorf("NACKs = %v, want none", res.NACKs)
	}
	if res.RPCs.RPCs == 0 {
		t.Error("no RPCs counted")
	}
}

// Stock, scenario 3: with the route on the refused cluster most RPCs fail (the client has no usable
// cluster for the route), and the cluster is NACKed over and over.
func TestStockScenario3RefusedRoute(t *testing.T) {
	t.Parallel()
	res, _ := stockRun(t, Scenario3RefusedRoute)
	if res.RPCs.RPCs == 0 || res.RPCs.Failed*2 <= res.RPCs.RPCs {
		t.Errorf("RPCs %s: want most to fail", res.RPCs)
	}
	if n := res.NACKs[ClusterType]; n <= 100 {
		t.Errorf("CDS NACKs = %d in %v, want > 100", n, res.Observed)
	}
	if r, ok := Find(res.CSDS, ClusterType, "bad"); !ok || r.Status != "NACKED" {
		t.Errorf("CSDS of cluster bad = %+v (found %v), want NACKED", r, ok)
	}
}

// Stock, scenario 4: the EDS request names only A, the snapshot has A and B: the cache logs "ADS
// mode: not responding" and the move of A never reaches the client, which stays on backend 0.
func TestStockScenario4UnrequestedCluster(t *testing.T) {
	t.Parallel()
	res, srv := stockRun(t, Scenario4UnrequestedCluster)
	if res.Delivered {
		t.Errorf("the move was delivered (%d RPCs on the new backend), stock should not deliver it", res.DeliveredRPCs)
	}
	if res.RPCs.ByBackend["s4-b0"] == 0 {
		t.Errorf("RPCs %s: want them on the old backend s4-b0", res.RPCs)
	}
	if res.Responses[EndpointType] != 0 {
		t.Errorf("EDS responses = %d after the move, want 0", res.Responses[EndpointType])
	}
	if srv.NotResponding() == 0 {
		t.Error("the cache never logged 'ADS mode: not responding'")
	}
	if r, ok := Find(res.CSDS, EndpointType, "A"); !ok || r.Version != "s4-1" {
		t.Errorf("CSDS of EDS A = %+v (found %v), want version s4-1 (the one before the move)", r, ok)
	}
}

// Two clients of two servers in one process, each bootstrapped on its own server.
func TestTwoServersOneProcess(t *testing.T) {
	t.Parallel()
	bs, err := StartBackends("two-b", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer StopBackends(bs)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, b := range bs {
		srv, err := NewStock()
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		if _, err := srv.SetSnapshot(State(RouteTo(RouteName, "c"), []*cluster.Cluster{Cluster("c")}, Endpoints("c", b.Addr))); err != nil {
			t.Fatal(err)
		}
		c, err := StartClient(srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.WaitBackend(ctx, b.Name); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		if _, err := c.StopLoop(); err != nil {
			t.Fatal(err)
		}
	}
}
