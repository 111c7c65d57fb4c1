package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// syncBuffer collects the server's logs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// started is a server run by the test, in-process through runWith, on ports of its own.
type started struct {
	xds, admin string
	logs       *syncBuffer
	done       chan error
	cancel     context.CancelFunc
}

func start(t *testing.T, file string, extra ...string) *started {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &started{logs: &syncBuffer{}, done: make(chan error, 1), cancel: cancel}
	ready := make(chan [2]string, 1)
	args := append([]string{"--resources", file, "--xds-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}, extra...)
	go func() {
		s.done <- runWith(ctx, args, nil, hooks{logOut: s.logs, ready: func(x, a string) { ready <- [2]string{x, a} }})
	}()
	select {
	case a := <-ready:
		s.xds, s.admin = a[0], a[1]
	case err := <-s.done:
		cancel()
		t.Fatalf("the server did not start: %v\n%s", err, s.logs)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatalf("the server did not start in 10s\n%s", s.logs)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-s.done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("the server did not stop in 10s")
		}
		if t.Failed() {
			t.Logf("server logs:\n%s", s.logs)
		}
	})
	return s
}

func (s *started) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + s.admin + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// eventually retries cond until it holds or 10 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// adsStream is a raw go-control-plane ADS SotW client stream.
type adsStream struct {
	stream discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	resps  chan *discovery.DiscoveryResponse
	errs   chan error
}

func dial(t *testing.T, addr string) *adsStream {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); conn.Close() })
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := &adsStream{stream: st, resps: make(chan *discovery.DiscoveryResponse, 16), errs: make(chan error, 1)}
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				a.errs <- err
				return
			}
			a.resps <- r
		}
	}()
	return a
}

func (a *adsStream) send(t *testing.T, req *discovery.DiscoveryRequest) {
	t.Helper()
	req.Node = &core.Node{Id: "test-node"}
	req.TypeUrl = resource.ClusterType
	// io.EOF: the server ended the stream (a refusal can beat the request out); its status is
	// Recv's, in errs.
	if err := a.stream.Send(req); err != nil && err != io.EOF {
		t.Fatal(err)
	}
}

func (a *adsStream) recv(t *testing.T) *discovery.DiscoveryResponse {
	t.Helper()
	select {
	case r := <-a.resps:
		return r
	case err := <-a.errs:
		t.Fatalf("stream: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no response in 10s")
	}
	return nil
}

// none checks no response arrives for d.
func (a *adsStream) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case r := <-a.resps:
		t.Fatalf("unexpected response, version %s", r.GetVersionInfo())
	case err := <-a.errs:
		t.Fatalf("stream: %v", err)
	case <-time.After(d):
	}
}

func clusters(t *testing.T, r *discovery.DiscoveryResponse) map[string]*cluster.Cluster {
	t.Helper()
	out := map[string]*cluster.Cluster{}
	for _, a := range r.GetResources() {
		var c cluster.Cluster
		if err := a.UnmarshalTo(&c); err != nil {
			t.Fatal(err)
		}
		out[c.GetName()] = &c
	}
	return out
}

func writeFile(t *testing.T, file, content string) {
	t.Helper()
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestServer(t *testing.T) {
	example, err := os.ReadFile("testdata/resources.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []struct {
		name  string
		guard bool
		args  []string
	}{
		{"guard", true, []string{"--plugin", "builtin"}}, // the plugin runtime, with its built-in policy
		{"stock", false, []string{"--guard=false"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			file := filepath.Join(t.TempDir(), "resources.yaml")
			writeFile(t, file, string(example))
			s := start(t, file, mode.args...)

			if code, body := s.get(t, "/healthz"); code != 200 || body != "ok" {
				t.Fatalf("/healthz: %d %q", code, body)
			}

			// The file's Cluster.
			a := dial(t, s.xds)
			a.send(t, &discovery.DiscoveryRequest{})
			r1 := a.recv(t)
			c := clusters(t, r1)["greeter-cluster"]
			if c == nil || c.GetConnectTimeout().AsDuration() != time.Second {
				t.Fatalf("want greeter-cluster with a 1s connect timeout, got %v", clusters(t, r1))
			}
			a.send(t, &discovery.DiscoveryRequest{VersionInfo: r1.GetVersionInfo(), ResponseNonce: r1.GetNonce()})

			// Delta on the same port.
			conn, err := grpc.NewClient(s.xds, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer dcancel()
			delta, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(dctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := delta.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "delta-node"}, TypeUrl: resource.ClusterType,
				ResourceNamesSubscribe: []string{"greeter-cluster"}}); err != nil {
				t.Fatal(err)
			}
			if dr, err := delta.Recv(); err != nil || len(dr.GetResources()) != 1 || dr.GetResources()[0].GetName() != "greeter-cluster" {
				t.Fatalf("delta: %v %v", dr, err)
			}
			dcancel()

			// A change of the file: a new version.
			writeFile(t, file, strings.Replace(string(example), "connect_timeout: 1s", "connect_timeout: 2.5s", 1))
			r2 := a.recv(t)
			if r2.GetVersionInfo() == r1.GetVersionInfo() {
				t.Fatalf("the same version %s after a change", r2.GetVersionInfo())
			}
			if c := clusters(t, r2)["greeter-cluster"]; c.GetConnectTimeout().AsDuration() != 2500*time.Millisecond {
				t.Fatalf("want the new connect timeout 2.5s, got %v", c.GetConnectTimeout())
			}
			a.send(t, &discovery.DiscoveryRequest{VersionInfo: r2.GetVersionInfo(), ResponseNonce: r2.GetNonce()})

			// A broken file: reported, the previous resources stay, the server is up.
			writeFile(t, file, "resources:\n  - {\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster, name: [oops]\n")
			eventually(t, "the ERROR line about the broken file", func() bool {
				for _, l := range strings.Split(s.logs.String(), "\n") {
					if strings.Contains(l, "[ERROR]") && strings.Contains(l, file) && strings.Contains(l, "error=") {
						return true
					}
				}
				return false
			})
			a.none(t, 300*time.Millisecond)
			if code, _ := s.get(t, "/healthz"); code != 200 {
				t.Fatalf("/healthz after a broken file: %d", code)
			}
			b := dial(t, s.xds)
			b.send(t, &discovery.DiscoveryRequest{})
			// (The guard's versions are the cache's with a suffix of the stream's: compare content.)
			rb := b.recv(t)
			if c := clusters(t, rb)["greeter-cluster"]; c.GetConnectTimeout().AsDuration() != 2500*time.Millisecond {
				t.Fatalf("a new client got %v (version %s), want the last good resources (2.5s)", c, rb.GetVersionInfo())
			}

			// A NACK: both series count it.
			writeFile(t, file, strings.Replace(string(example), "connect_timeout: 1s", "connect_timeout: 3s", 1))
			r3 := a.recv(t)
			a.send(t, &discovery.DiscoveryRequest{VersionInfo: r2.GetVersionInfo(), ResponseNonce: r3.GetNonce(),
				ErrorDetail: &status.Status{Code: 3, Message: `resource "greeter-cluster": connect_timeout too long`}})
			nacks := `kds_xds_nacks_total{type_url="` + resource.ClusterType + `"} 1`
			responses := `kds_xds_responses_total{type_url="` + resource.ClusterType + `"}`
			eventually(t, "/metrics with "+nacks+" and "+responses, func() bool {
				code, body := s.get(t, "/metrics")
				return code == 200 && strings.Contains(body, nacks) && strings.Contains(body, responses)
			})

			code, body := s.get(t, "/clients")
			if !mode.guard {
				if code != http.StatusNotFound || !strings.Contains(body, "guard is off") {
					t.Fatalf("/clients with --guard=false: %d %q", code, body)
				}
				return
			}
			var insight struct {
				Items []struct {
					Node  string `json:"node"`
					Types []struct {
						TypeURL string `json:"typeUrl"`
						NACKs   int64  `json:"nacks"`
					} `json:"types"`
				} `json:"items"`
				Total int `json:"total"`
			}
			if code != 200 || json.Unmarshal([]byte(body), &insight) != nil || insight.Total != 2 {
				t.Fatalf("/clients: %d %s", code, body)
			}
			found := false
			for _, it := range insight.Items {
				for _, ty := range it.Types {
					found = found || (it.Node == "test-node" && ty.TypeURL == resource.ClusterType && ty.NACKs == 1)
				}
			}
			if !found {
				t.Fatalf("/clients does not show the NACK: %s", body)
			}
		})
	}
}

func TestBadFileAtStart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "resources.yaml")
	writeFile(t, file, "resources:\n  - {\"@type\": type.googleapis.com/no.such.Type, name: x}\n")
	err := run(context.Background(), []string{"--resources", file, "--xds-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}, nil)
	if err == nil || !strings.Contains(err.Error(), file) {
		t.Fatalf("want an error naming %s, got %v", file, err)
	}
}

func TestEnvironmentTwins(t *testing.T) {
	cfg, _, err := parse([]string{"--xds-addr", "127.0.0.1:1"}, []string{
		"KDS_XDS_SERVER_XDS_ADDR=127.0.0.1:2", // the flag wins
		"KDS_XDS_SERVER_RESOURCES=r.yaml",
		"KDS_XDS_SERVER_GUARD=false",
		"KDS_XDS_SERVER_OWNER_HOLDS=false",
		"KDS_XDS_SERVER_PLUGIN=a,b",
		"KDS_XDS_SERVER_ALLOW_EMPTY=true",
		"KDS_XDS_SERVER_MAX_RESOURCES_BYTES=1024",
		"KDS_XDS_SERVER_RESOURCES_REREAD=0",
		"KDS_XDS_SERVER_TLS_CLIENT_CA=ca.pem",
		"KDS_XDS_SERVER_CACHE=mux",
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.xdsAddr != "127.0.0.1:1" || cfg.resources != "r.yaml" || cfg.guard || cfg.ownerHolds || len(cfg.plugins) != 2 ||
		!cfg.allowEmpty || cfg.maxResourcesBytes != 1024 || cfg.resourcesReread != 0 || cfg.tlsClientCA != "ca.pem" || cfg.cacheKind != cacheMux {
		t.Fatalf("%+v", cfg)
	}
	_, f, _ := parse(nil, nil)
	var sb strings.Builder
	usage(&sb, f)
	for _, want := range []string{"KDS_XDS_SERVER_ADMIN_ADDR", "KDS_XDS_SERVER_PLUGIN_CONFIG", "KDS_XDS_SERVER_TLS_CERT", "KDS_XDS_SERVER_CACHE", "linear (a LinearCache per type", "mux (the same MuxCache", "plaintext", "network policy", "rename it into place"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

// TestProcess runs the built binary: SIGTERM stops it (exit 0) while a client stream is open,
// and a bad file at start exits 1.
func TestProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "xds-server")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, "resources: [1]\n")
	cmd := exec.Command(bin, "--resources", bad)
	if out, err := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), bad) {
		t.Fatalf("a bad file at start: %v, exit %d, %s", err, cmd.ProcessState.ExitCode(), out)
	}

	logs := &syncBuffer{}
	cmd = exec.Command(bin, "--xds-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "KDS_XDS_SERVER_RESOURCES=testdata/resources.yaml")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var xds string
	eventually(t, "the serving line", func() bool {
		_, rest, ok := strings.Cut(logs.String(), "serving: xds=")
		xds, _, _ = strings.Cut(rest, " ")
		return ok
	})
	a := dial(t, xds)
	a.send(t, &discovery.DiscoveryRequest{})
	if c := clusters(t, a.recv(t))["greeter-cluster"]; c == nil {
		t.Fatal("no greeter-cluster")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		if err != nil || !strings.Contains(logs.String(), "stopped") {
			t.Fatalf("after SIGTERM: %v\n%s", err, logs)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no exit 10s after SIGTERM\n%s", logs)
	}
}
