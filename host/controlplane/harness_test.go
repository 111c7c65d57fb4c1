package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/store/pgtest"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

var pg pgtest.Shared

// testKeys sign the tokens of every global and zone of these tests: each global runs with
// authentication on, and each zone proves its name with a real zone token.
var testKeys = sync.OnceValue(func() *auth.Keys {
	k, err := auth.NewKeys()
	if err != nil {
		panic(err)
	}
	return k
})

// token mints a token of the test keys.
func token(t testing.TB, c auth.Claims) string {
	t.Helper()
	tok, err := testKeys().Issue(c, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// adminToken is an admin user's token for the tests' globals.
func adminToken(t testing.TB) string {
	return token(t, auth.Claims{Kind: auth.KindUser, Name: "admin", Groups: []string{auth.GroupAdmin}})
}

// zoneTokenFile writes a zone token for name and returns its file.
func zoneTokenFile(t testing.TB, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".token")
	if err := os.WriteFile(path, []byte(token(t, auth.Claims{Kind: auth.KindZone, Name: name})+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestMain(m *testing.M) {
	code := m.Run()
	pg.Stop()
	testbin.Cleanup()
	os.Exit(code)
}

func logger(t testing.TB, name string) hclog.Logger {
	if os.Getenv("KDS_TEST_LOG") == "" {
		return hclog.NewNullLogger()
	}
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Debug})
}

func openSQLite(t testing.TB) store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func openPostgres(t testing.TB) store.Store {
	t.Helper()
	return openPostgresAt(t, pg.Database(t))
}

// openPostgresAt opens a store of the PostgreSQL database dsn, closed when the test ends.
func openPostgresAt(t testing.TB, dsn string) store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), dsn, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

type runningGlobal struct {
	*controlplane.Global
	stop func()
}

// startGlobal runs a global on loopback (plaintext KDS unless cfg sets TLS) until the test ends
// or stop is called.
func startGlobal(t testing.TB, st store.Store, reg *resource.Registry, mutate ...func(*controlplane.GlobalConfig)) *runningGlobal {
	t.Helper()
	cfg := controlplane.GlobalConfig{
		Store: st, Registry: reg, KDSAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0", DiagAddr: "127.0.0.1:0",
		Logger: logger(t, "global"), Builtin: retrypolicy.New(), PollInterval: 50 * time.Millisecond, ProbeInterval: 50 * time.Millisecond,
		Keys: testKeys(), KDSAuth: true,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	g, err := controlplane.NewGlobal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := runUntilStopped(t, "global", g.Run)
	return &runningGlobal{Global: g, stop: stop}
}

// runUntilStopped runs run in the background until the returned stop is called or the test
// ends, and reports an error or a stop that takes longer than 15 s.
func runUntilStopped(t testing.TB, name string, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: %v", name, err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("%s did not stop within 15s", name)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

type runningZone struct {
	*controlplane.Zone
	Store store.Store
	stop  func()
}

func startZone(t testing.TB, name, kdsAddr string, st store.Store, reg *resource.Registry, mutate ...func(*zone.Config)) *runningZone {
	t.Helper()
	kcfg := zone.Config{Zone: name, GlobalAddress: "grpc://" + kdsAddr, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		TokenFile: zoneTokenFile(t, name)}
	for _, m := range mutate {
		m(&kcfg)
	}
	z, err := controlplane.NewZone(controlplane.ZoneConfig{Store: st, Registry: reg, APIAddr: "127.0.0.1:0", DiagAddr: "127.0.0.1:0",
		Logger: logger(t, name), KDS: kcfg, ProbeInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := runUntilStopped(t, name, z.Run)
	return &runningZone{Zone: z, Store: st, stop: stop}
}

// put writes through the store as the API would (validated).
func put(t testing.TB, st store.Store, reg *resource.Registry, r resource.Resource) {
	t.Helper()
	if err := reg.Validate(&r); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Put(context.Background(), r); err != nil {
		t.Fatalf("put %s: %v", r.Key(), err)
	}
}

func mesh(name string) resource.Resource {
	return resource.Resource{Kind: "Mesh", Name: name, Spec: json.RawMessage(`{}`)}
}

func timeout(mesh, name, d string) resource.Resource {
	return resource.Resource{Kind: "MeshTimeout", Mesh: mesh, Name: name,
		Spec: json.RawMessage(fmt.Sprintf(`{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":%q}}`, d))}
}

// count returns how many resources of kind the store holds in mesh ("" for all).
func count(st store.Store, kind, mesh string) func() int {
	return func() int {
		rs, err := st.List(context.Background(), kind, mesh)
		if err != nil {
			return -1
		}
		return len(rs)
	}
}

var _ = NewWithT
