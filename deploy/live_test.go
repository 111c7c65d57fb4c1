package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/store/pgtest"
	"github.com/kds-host/kds-host/internal/testbin"
)

// patience bounds each wait on the real processes. It is no claim on how long anything takes.
const patience = 2 * time.Minute

// Every metric a rule or a panel queries is exported by a real global or zone, and what they
// export passes promtool's lint. The global runs on PostgreSQL (its LISTEN connection) with the
// reference plugins as processes; the zone has its admission down for Mesh at start (NACKs,
// retry rounds, re-requests) and refuses one MeshTimeout as INVALID (parked); one MeshTimeout
// names an owner that exists nowhere (withheld, REJECT) and one stored row cannot be encoded
// (unservable). The scrapes of both are taken until every name is seen, with the zone connected;
// then promtool lints the last of each (skipped without promtool, but under CI).
func TestEveryQueriedMetricIsExportedByARealGlobalOrZone(t *testing.T) {
	g := NewWithT(t)
	queries, recorded, err := allQueries()
	g.Expect(err).NotTo(HaveOccurred())
	for _, q := range queries {
		_, err := metricNames(q.expr)
		g.Expect(err).NotTo(HaveOccurred(), q.where)
	}

	dsn := pgtest.Start(t)
	kdsHost := testbin.Build(t, "./host/cmd/kds-host")
	global := startHost(t, "global", kdsHost, "--store", dsn,
		"--plugin", testbin.Build(t, "./plugins/retry-forcer"), "--plugin", testbin.Build(t, "./plugins/owner-check"))

	// What the zone will refuse and what the global withholds, before the zone starts.
	resources := writeFile(t, "resources.yaml", `type: Mesh
name: default
---
type: MeshTimeout
mesh: default
name: refused-by-the-zone
labels:
  kds-host.test/deny: "yes"
spec:
  targetRef: {kind: Mesh}
  default: {connectionTimeout: 2s}
---
type: MeshTimeout
mesh: default
name: owner-nowhere
owners:
  - {kind: MeshRetry, mesh: default, name: nowhere}
spec:
  targetRef: {kind: Mesh}
  default: {connectionTimeout: 3s}
`)
	out, err := exec.Command(kdsHost, "apply", "-f", resources, "--cp", "http://"+global.api, "--data-dir", global.dataDir).CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "kds-host apply:\n%s", out)

	// A row the global cannot encode, written past the API's validation as a manual fix would.
	st, err := store.Open(context.Background(), dsn, "")
	g.Expect(err).NotTo(HaveOccurred())
	defer st.Close()
	_, _, err = st.Put(context.Background(), resource.Resource{Kind: "MeshTimeout", Mesh: "default", Name: "unservable", Spec: json.RawMessage(`[1]`)})
	g.Expect(err).NotTo(HaveOccurred())

	zone := startHost(t, "zone", kdsHost, "--mode", "zone", "--zone-name", "zone-1",
		"--global-address", "grpc://"+global.kds, "--zone-token-file", global.zoneToken(t, "zone-1"),
		"--admission-outage", "Mesh=2s", "--admission-deny-label", "kds-host.test/deny=yes")

	// Scrape both until every queried name was seen in a scrape, the zone connected in the last.
	exported := map[string]bool{}
	var lastGlobal, lastZone string
	g.Eventually(func() []string {
		lastGlobal, lastZone = scrape(t, global.diag), scrape(t, zone.diag)
		exportedNames(exported, lastGlobal)
		exportedNames(exported, lastZone)
		problems := unknownMetrics(queries, exported, recorded)
		if !strings.Contains(lastGlobal, "\nkds_zone_connected{zone=\"zone-1\"} 1\n") {
			problems = append(problems, "the global does not show zone-1 connected")
		}
		if !strings.Contains(lastZone, "\nkds_zone_client_connected{zone=\"zone-1\"} 1\n") {
			problems = append(problems, "zone-1 does not show itself connected")
		}
		return problems
	}, patience, 200*time.Millisecond).Should(BeEmpty(), "global:\n%s\nzone:\n%s", global.out, zone.out)
	g.Expect(exported).To(HaveKey("kds_plugin_calls_total"))
	g.Expect(lastGlobal).To(ContainSubstring(`kds_nacks_total{kind="Mesh",zone="zone-1"}`))

	bin := promtool(t)
	for name, scraped := range map[string]string{"global": lastGlobal, "zone": lastZone} {
		cmd := exec.Command(bin, "check", "metrics")
		cmd.Stdin = strings.NewReader(scraped)
		out, err := cmd.CombinedOutput()
		g.Expect(err).NotTo(HaveOccurred(), "promtool check metrics on the %s's /metrics:\n%s", name, out)
		g.Expect(strings.TrimSpace(string(out))).To(BeEmpty(), "promtool check metrics on the %s's /metrics", name)
	}
}

// scrape returns a diagnostics server's /metrics.
func scrape(t *testing.T, diag string) string {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + diag + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %s %v", diag, resp.Status, err)
	}
	return string(b)
}

// host is a kds-host process on loopback ports, stopped when the test ends.
type host struct {
	kds, api, diag, dataDir string
	cmd                     *exec.Cmd
	out                     *syncBuffer
	exited                  chan struct{}
	waitErr                 error
}

// startHost starts kds-host (a global, or a zone with --mode zone) on free loopback ports and
// waits until it is ready. Ports are picked free and then bound by the process: when another
// test took one meanwhile, it starts again on others.
func startHost(t *testing.T, name, bin string, args ...string) *host {
	t.Helper()
	for attempt := 1; ; attempt++ {
		h := launch(t, name, bin, args...)
		err := h.waitReady(patience)
		if err != nil && attempt < 3 && strings.Contains(h.out.String(), "address already in use") {
			continue
		}
		if err != nil {
			t.Fatalf("%s did not become ready: %v\n%s", name, err, h.out)
		}
		return h
	}
}

func launch(t *testing.T, name, bin string, args ...string) *host {
	t.Helper()
	ports := freePorts(t, 3)
	h := &host{kds: ports[0], api: ports[1], diag: ports[2], dataDir: t.TempDir(), out: &syncBuffer{}, exited: make(chan struct{})}
	common := []string{"--data-dir", h.dataDir, "--api-addr", h.api, "--diag-addr", h.diag}
	if !isZone(args) {
		common = append(common, "--kds-plaintext", "--kds-addr", h.kds)
	}
	h.cmd = exec.Command(bin, append(common, args...)...)
	h.cmd.Stdout, h.cmd.Stderr = h.out, h.out
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		h.waitErr = h.cmd.Wait()
		close(h.exited)
	}()
	t.Cleanup(func() {
		_ = h.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-h.exited:
		case <-time.After(15 * time.Second):
			_ = h.cmd.Process.Kill()
			<-h.exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, h.out)
		}
	})
	return h
}

func isZone(args []string) bool {
	for i, a := range args {
		if a == "--mode=zone" || a == "--mode" && i+1 < len(args) && args[i+1] == "zone" {
			return true
		}
	}
	return false
}

// waitReady waits until the host's /readyz answers 200, it exits, or d passes.
func (h *host) waitReady(d time.Duration) error {
	deadline := time.Now().Add(d)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := client.Get("http://" + h.diag + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		select {
		case <-h.exited:
			return fmt.Errorf("exited: %v", h.waitErr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return err
		}
	}
}

// zoneToken mints a zone token on the global with its admin token and writes it to a file.
func (h *host) zoneToken(t *testing.T, zone string) string {
	t.Helper()
	admin, err := auth.ReadTokenFile(filepath.Join(h.dataDir, auth.AdminTokenFile))
	if err != nil {
		t.Fatalf("the global made no admin token: %v", err)
	}
	client := &api.Client{BaseURL: "http://" + h.api, HTTPClient: &http.Client{Timeout: 10 * time.Second}, Token: admin}
	var resp controlplane.TokenResponse
	if err := client.PostJSON(context.Background(), "/api/tokens/zone", controlplane.TokenRequest{Name: zone}, &resp); err != nil {
		t.Fatal(err)
	}
	return writeFile(t, zone+".token", resp.Token)
}

// freePorts returns n loopback addresses free now.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	for _, ln := range lns {
		ln.Close()
	}
	return out
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// syncBuffer collects a process's output.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
