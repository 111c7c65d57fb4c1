package xdstest

import (
	"context"
	"os"
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

// The four scenarios run against the stock server and the guard in github.com/kds-host/kds-host/guard
// (scenarios_test.go), each in one test.

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
