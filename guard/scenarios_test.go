package guard_test

import (
	"context"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"

	"github.com/kds-host/kds-host/guard"
	"github.com/kds-host/kds-host/internal/xdstest"
)

// mode is the server a scenario runs against.
type mode int

const (
	stockServer   mode = iota // stock go-control-plane v0.14's SotW ADS server over its SnapshotCache
	guarded                   // the same, its cache wrapped by the guard: a watch of it per stream
	guardedLinear             // the guard over LinearCaches, one per type: one watch a type for every stream, and the guard's codec
	engineCache               // the engine's own cache (guard.NewCache), the stock server serving it
)

func (m mode) String() string {
	return [...]string{"stock", "guard", "guard over LinearCaches", "the engine's own cache"}[m]
}

// guards are the guarded modes every scenario's guarded outcome must hold in.
var guards = []mode{guarded, guardedLinear, engineCache}

// run runs a scenario of grpc-go's own xDS client against a stock go-control-plane v0.14 SotW
// ADS server, as m says, and logs what it counted.
//
// For a guarded run it returns the guard's insight as it was at the end, with the client
// still connected.
func run(t *testing.T, m mode, s func(context.Context, xdstest.Server, xdstest.Options) (*xdstest.Result, error)) (*xdstest.Result, []guard.ClientInsight) {
	t.Helper()
	var g *guard.Guard
	cfg := xdstest.Config{Linear: m == guardedLinear}
	if m == guarded || m == guardedLinear {
		cfg.Wrap = func(inner cache.Cache, cb server.Callbacks) (cache.Cache, server.Callbacks, func()) {
			var err error
			// The MuxCache of LinearCaches chooses by type URL: it answers every node alike.
			if g, err = guard.New(inner, guard.Options{NodeIndependent: m == guardedLinear}); err != nil {
				t.Fatal(err)
			}
			return g, g.Callbacks(cb), g.Close
		}
	}
	if m == guardedLinear {
		cfg.ServerOptions = func() []grpc.ServerOption { return []grpc.ServerOption{grpc.ForceServerCodecV2(g.Codec())} }
	}
	var kc *guard.Cache
	if m == engineCache {
		cfg.Own = func(cb server.Callbacks) (cache.Cache, server.Callbacks, func(map[string][]types.Resource) error, func()) {
			var err error
			if kc, err = guard.NewCache([]string{xdstest.ListenerType, xdstest.RouteType, xdstest.ClusterType, xdstest.EndpointType}, guard.Options{}); err != nil {
				t.Fatal(err)
			}
			return kc, kc.Callbacks(cb), kc.SetResources, kc.Close
		}
		cfg.ServerOptions = func() []grpc.ServerOption { return []grpc.ServerOption{grpc.ForceServerCodecV2(kc.Codec())} }
	}
	srv, err := xdstest.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var insight []guard.ClientInsight
	res, err := s(ctx, srv, xdstest.Options{AtEnd: func() {
		if g != nil {
			insight = g.Clients()
		}
		if kc != nil {
			insight = kc.Clients()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s, %s: nacks=%v responses=%v delivered=%v (%d) not-responding=%d\n  %s",
		m, res.Scenario, res.NACKs, res.Responses, res.Delivered, res.DeliveredRPCs, srv.NotResponding(), res.RPCs)
	for _, r := range res.CSDS {
		t.Logf("  csds %s %s %s v=%q nack=%q", r.TypeURL, r.Name, r.Status, r.Version, r.NACK)
	}
	if !res.Ready {
		t.Fatalf("%s: the client never got ready: %v", m, res.Notes)
	}
	for _, c := range insight {
		for _, ti := range c.Types {
			t.Logf("  guard insight: %s responses=%d acks=%d nacks=%d resent=%d withheld=%+v", ti.TypeURL, ti.Responses, ti.ACKs, ti.NACKs, ti.Resent, ti.Withheld)
		}
	}
	return res, insight
}

func withheld(insight []guard.ClientInsight, typeURL string) []guard.Withheld {
	var out []guard.Withheld
	for _, c := range insight {
		for _, ti := range c.Types {
			if ti.TypeURL == typeURL {
				out = append(out, ti.Withheld...)
			}
		}
	}
	return out
}

// Scenario 1: a cluster the client refuses (lb_policy MAGLEV). Stock resends it after every NACK
// (a NACK storm); guarded, it is sent the policy's attempts (3, the built-in policy's
// invalidAttempts), then withheld with the client's reason. RPCs keep flowing either way, and
// another cluster's endpoint move reaches the client. Each guarded outcome holds with the guard
// over a SnapshotCache (a watch of it per stream), over LinearCaches with its codec, and with the
// engine's own cache.
func TestScenario1ARefusedCluster(t *testing.T) {
	t.Parallel()
	stocked, _ := run(t, stockServer, xdstest.Scenario1RefusedCluster)
	if n := stocked.NACKs[xdstest.ClusterType]; n <= 100 {
		t.Errorf("stock: CDS NACKs = %d, want a storm (> 100)", n)
	}
	for _, m := range guards {
		res, g := run(t, m, xdstest.Scenario1RefusedCluster)
		if n := res.NACKs[xdstest.ClusterType]; n < 1 || n > 3 {
			t.Errorf("%s: CDS NACKs = %d, want 1 to 3 (the policy's attempts)", m, n)
		}
		if res.RPCs.Failed != 0 || res.RPCs.RPCs == 0 {
			t.Errorf("%s: RPCs %s, want none failed", m, res.RPCs)
		}
		if !res.Delivered {
			t.Errorf("%s: the good cluster's endpoint move was not delivered: %s", m, res.RPCs)
		}
		w := withheld(g, xdstest.ClusterType)
		if len(w) != 1 || w[0].Name != "bad" {
			t.Fatalf("%s: withheld clusters %+v, want bad", m, w)
		}
		t.Logf("%s: withheld %s: %s", m, w[0].Name, w[0].Reason)
	}
}

// Scenario 2: 20 route switches, each to a new valid cluster with its endpoints. Guarded, each
// new route waits until the client has the cluster and its endpoints (make-before-break): no RPC
// fails because of the server. grpc-go itself may fail an RPC mid-switch ("unknown cluster
// selected for RPC"); those are counted apart.
func TestScenario2RouteSwitches(t *testing.T) {
	t.Parallel()
	stocked, _ := run(t, stockServer, xdstest.Scenario2RouteSwitches)
	t.Logf("stock: failure kinds %v", stocked.RPCs.Kinds())
	for _, m := range guards {
		res, _ := run(t, m, xdstest.Scenario2RouteSwitches)
		kinds := res.RPCs.Kinds()
		t.Logf("%s: failure kinds %v", m, kinds)
		if n := res.RPCs.Failed - kinds[xdstest.KindMidSwitch]; n != 0 {
			t.Errorf("%s: %d RPCs failed because of the server: %s", m, n, res.RPCs)
		}
		if !res.Delivered {
			t.Errorf("%s: the last cluster's backend served no RPC: %s", m, res.RPCs)
		}
		for typeURL, n := range res.NACKs {
			if n != 0 {
				t.Errorf("%s: %d NACKs of %s, want none", m, n, typeURL)
			}
		}
	}
}

// Scenario 3: the route switched to a cluster the client refuses. Stock: most RPCs fail as long
// as the route stands. Guarded: the route is withheld until the client accepts its cluster, which
// it never does: 0 RPCs fail, and the route's reason names the cluster and why it was refused.
func TestScenario3ARouteToARefusedCluster(t *testing.T) {
	t.Parallel()
	stocked, _ := run(t, stockServer, xdstest.Scenario3RefusedRoute)
	if stocked.RPCs.Failed*2 <= stocked.RPCs.RPCs {
		t.Errorf("stock: RPCs %s, want most to fail", stocked.RPCs)
	}
	for _, m := range guards {
		res, g := run(t, m, xdstest.Scenario3RefusedRoute)
		if res.RPCs.Failed != 0 || res.RPCs.RPCs == 0 {
			t.Errorf("%s: RPCs %s, want none failed", m, res.RPCs)
		}
		if n := res.NACKs[xdstest.ClusterType]; n > 3 {
			t.Errorf("%s: CDS NACKs = %d, want at most 3", m, n)
		}
		w := withheld(g, xdstest.RouteType)
		if len(w) != 1 {
			t.Fatalf("%s: withheld routes %+v, want the route", m, w)
		}
		t.Logf("%s: withheld %s: %s", m, w[0].Name, w[0].Reason)
	}
}

// Scenario 4: an endpoint move on a cluster, with another cluster in the snapshot that the client
// does not ask for. Stock never delivers it ("ADS mode: not responding"); guarded it is.
func TestScenario4AnEndpointMoveBesideAnUnrequestedCluster(t *testing.T) {
	t.Parallel()
	stocked, _ := run(t, stockServer, xdstest.Scenario4UnrequestedCluster)
	if stocked.Delivered {
		t.Errorf("stock delivered the move: the baseline changed")
	}
	for _, m := range guards {
		res, _ := run(t, m, xdstest.Scenario4UnrequestedCluster)
		if !res.Delivered {
			t.Errorf("%s: the move was not delivered: %s", m, res.RPCs)
		}
		if res.RPCs.Failed != 0 {
			t.Errorf("%s: RPCs %s, want none failed", m, res.RPCs)
		}
	}
}
