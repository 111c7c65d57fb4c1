package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"

	"github.com/kds-host/kds-host/internal/testbin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup() // the plugin binaries testbin.Build made, once per test process
	os.Exit(code)
}

// TestRealPlugins loads the repository's plugin binaries with --plugin, as an operator would: the
// Go retry-forcer (pinned, PATH@sha256:HEX), the Go owner-check and the Node.js example
// (examples/plugins/node-retry; skipped without node and npm, required under CI=true, as the
// other tests of that plugin). Each is reported up in /metrics; a NACK on a raw ADS stream gets
// its resend from a retry plugin's decision.
func TestRealPlugins(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the plugin binaries")
	}
	for _, p := range []struct {
		name   string                  // the plugin's name in the runtime's metrics
		flag   func(*testing.T) string // the --plugin value
		policy string                  // its policy document ("": none)
		retry  bool                    // a RetryForcer: a NACK gets its decision
		owner  bool                    // an OwnerCheck: what is sent was asked about first
	}{
		{"retry-forcer", func(t *testing.T) string { return pinned(t, testbin.Build(t, "./plugins/retry-forcer")) },
			"policy: fixed\ndelay: 50ms\n", true, false},
		// The guard asks the owner check before it sends a version (guard.Options.OwnerCheck).
		{"owner-check", func(t *testing.T) string { return testbin.Build(t, "./plugins/owner-check") }, "", false, true},
		{"node-retry", func(t *testing.T) string { return testbin.NodePlugin(t) }, "delay: 50ms\nmaxAttempts: 0\n", true, false},
	} {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			args := []string{"--plugin", p.flag(t)}
			if p.policy != "" {
				doc := filepath.Join(dir, "policy.yaml")
				writeFile(t, doc, p.policy)
				args = append(args, "--plugin-config", doc)
			}
			s := start(t, "testdata/resources.yaml", args...)

			if code, body := s.get(t, "/healthz"); code != 200 || body != "ok" {
				t.Fatalf("/healthz: %d %q", code, body)
			}
			up := `kds_plugin_up{plugin="` + p.name + `"} 1`
			if code, body := s.get(t, "/metrics"); code != 200 || !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(up)+`$`).MatchString(body) {
				t.Fatalf("/metrics lacks %s:\n%s", up, body)
			}
			calls := func() int {
				_, body := s.get(t, "/metrics")
				n := 0
				re := regexp.MustCompile(`(?m)^kds_plugin_calls_total\{method="[^"]*",plugin="` + regexp.QuoteMeta(p.name) + `"\} (\d+)$`)
				for _, m := range re.FindAllStringSubmatch(body, -1) {
					v, _ := strconv.Atoi(m[1])
					n += v
				}
				return n
			}
			before := calls()
			if p.owner {
				a := dial(t, s.xds)
				a.send(t, &discovery.DiscoveryRequest{})
				if r := a.recv(t); clusters(t, r)["greeter-cluster"] == nil {
					t.Fatalf("no greeter-cluster in %v", r)
				}
				if n := calls(); n <= before {
					t.Fatalf("kds_plugin_calls_total{plugin=%q}: %d before the request, %d after the response: the owner check was not asked", p.name, before, n)
				}
			}
			if !p.retry {
				return
			}

			a := dial(t, s.xds)
			a.send(t, &discovery.DiscoveryRequest{})
			r1 := a.recv(t)
			if clusters(t, r1)["greeter-cluster"] == nil {
				t.Fatalf("no greeter-cluster in %v", r1)
			}
			a.send(t, &discovery.DiscoveryRequest{ResponseNonce: r1.GetNonce(),
				ErrorDetail: &status.Status{Code: 3, Message: `resource "greeter-cluster": refused`}})
			// The plugin decides the retry: it is called, and after its delay the guard resends
			// the refused content (any response before it is ACKed, as a client would).
			for {
				r := a.recv(t)
				if clusters(t, r)["greeter-cluster"] != nil {
					break
				}
				t.Logf("before the resend: version %s, %d resources", r.GetVersionInfo(), len(r.GetResources()))
				a.send(t, &discovery.DiscoveryRequest{VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()})
			}
			if n := calls(); n <= before {
				t.Fatalf("kds_plugin_calls_total{plugin=%q}: %d before the NACK, %d after the resend", p.name, before, n)
			}
			var insight struct {
				Items []struct {
					Types []struct {
						TypeURL string `json:"typeUrl"`
						NACKs   int64  `json:"nacks"`
						Resent  int64  `json:"resent"`
					} `json:"types"`
				} `json:"items"`
			}
			code, body := s.get(t, "/clients")
			if code != 200 || json.Unmarshal([]byte(body), &insight) != nil || len(insight.Items) != 1 {
				t.Fatalf("/clients: %d %s", code, body)
			}
			for _, ty := range insight.Items[0].Types {
				if ty.TypeURL == resource.ClusterType && (ty.NACKs != 1 || ty.Resent < 1) {
					t.Fatalf("/clients: want 1 NACK and a resend of the clusters, got %s", body)
				}
			}
		})
	}
}

// pinned returns bin's --plugin value pinned to its checksum, PATH@sha256:HEX.
func pinned(t *testing.T, bin string) string {
	t.Helper()
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return bin + "@sha256:" + hex.EncodeToString(sum[:])
}
