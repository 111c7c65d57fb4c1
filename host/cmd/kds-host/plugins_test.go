package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"
	"github.com/spf13/pflag"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/policy"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

func TestPluginFlags(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	doc := filepath.Join(dir, "fixed.yaml")
	g.Expect(os.WriteFile(doc, []byte("policy: fixed\n"), 0o600)).To(Succeed())

	f := pluginFlags{paths: []string{"./bin/retry-forcer@sha256:" + strings.Repeat("a", 64), "builtin"}, documents: []string{"retry-forcer=" + doc}}
	p, err := f.load()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.List).To(HaveLen(2))
	g.Expect(p.List[0].Path).To(Equal("./bin/retry-forcer"))
	g.Expect(p.List[0].SHA256).To(HaveLen(32))
	g.Expect(p.Documents).To(HaveKeyWithValue("retry-forcer", policy.Document{Source: doc, Data: []byte("policy: fixed\n")}))

	f.documents = append(f.documents, "retry-forcer="+doc)
	_, err = f.load()
	g.Expect(err).To(MatchError(`--plugin-config: two documents for plugin "retry-forcer"`))
	_, err = (&pluginFlags{paths: []string{"x@sha256:12"}}).load()
	g.Expect(err).To(MatchError(ContainSubstring("--plugin: plugin \"x@sha256:12\": the checksum must be 64 hex digits")))

	// --config wins.
	cfg := filepath.Join(dir, "kds.yaml")
	g.Expect(os.WriteFile(cfg, []byte("plugins: [{path: builtin, configFile: fixed.yaml}]\n"), 0o600)).To(Succeed())
	f.config = cfg
	p, err = f.load()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.List).To(HaveLen(1))
	g.Expect(p.Documents).To(BeEmpty())

	g.Expect(f.refuseInZone()).To(MatchError(ContainSubstring("are global flags")))
	g.Expect((&pluginFlags{}).refuseInZone()).To(Succeed())
	g.Expect((&pluginFlags{env: []string{"AWS_REGION"}}).refuseInZone()).To(MatchError(ContainSubstring("--plugin-env are global flags")))
	_, err = (&pluginFlags{env: []string{"AWS_REGION=eu-1"}}).start(hclog.NewNullLogger(), &controlplane.GlobalConfig{})
	g.Expect(err).To(MatchError(`--plugin-env: environment variable "AWS_REGION=eu-1": give a name alone; the plugin gets the host's value`))

	// Env twins: KDS_PLUGIN is a comma list.
	t.Setenv("KDS_PLUGIN", "./a,./b@sha256:"+strings.Repeat("b", 64))
	root := newRootCmd()
	root.SetArgs([]string{"--mode", "global", "--log-level", "nope"}) // the twins are read, then the run stops at once
	_ = root.Execute()
	flag := root.Flags().Lookup("plugin")
	g.Expect(flag.Value.String()).To(Equal("[./a,./b@sha256:" + strings.Repeat("b", 64) + "]"))

	// KDS_PLUGIN_ENV too.
	t.Setenv("KDS_PLUGIN_ENV", "AWS_REGION,PLUGIN_MODE")
	root = newRootCmd()
	root.SetArgs([]string{"--mode", "global", "--log-level", "nope"}) // the twins are read, then the run stops at once
	_ = root.Execute()
	g.Expect(root.Flags().Lookup("plugin-env").Value.(pflag.SliceValue).GetSlice()).To(Equal([]string{"AWS_REGION", "PLUGIN_MODE"}))
}

// TestAPluginSeesNoneOfTheHostsSecrets runs kds-host with a database password in KDS_STORE and
// a cloud key in its environment, and a plugin that reports the environment it got: it sees
// PATH, HOME, TMPDIR and the --plugin-env names (given as KDS_PLUGIN_ENV), nothing else.
func TestAPluginSeesNoneOfTheHostsSecrets(t *testing.T) {
	g := NewWithT(t)
	bin := testbin.Build(t, "./shared/launch/testdata/env")
	dir := t.TempDir()
	report := filepath.Join(dir, "env.json")
	h := startHostEnv(t, []string{
		"KDS_STORE=postgres://kds:s3cret-db-password@127.0.0.1:1/kds", // --store below wins; the variable stays set
		"AWS_SECRET_ACCESS_KEY=s3cret-cloud-key",
		"KDS_PLUGIN_ENV=ENV_REPORT_FILE,PLUGIN_REGION",
		"ENV_REPORT_FILE=" + report,
		"PLUGIN_REGION=eu-1",
		"TMPDIR=" + dir,
	}, "--store", filepath.Join(dir, "kds.db"), "--plugin", bin)

	b, err := os.ReadFile(report)
	g.Expect(err).NotTo(HaveOccurred())
	var list []string
	g.Expect(json.Unmarshal(b, &list)).To(Succeed())
	env := map[string]string{}
	for _, kv := range list {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
		g.Expect(v).NotTo(ContainSubstring("s3cret"), "%s leaks a secret", k)
	}
	g.Expect(slices.Collect(maps.Keys(env))).To(ConsistOf("PATH", "HOME", "TMPDIR", "ENV_REPORT_FILE", "PLUGIN_REGION",
		"KDS_HOST_PLUGIN", "PLUGIN_MIN_PORT", "PLUGIN_MAX_PORT", "PLUGIN_PROTOCOL_VERSIONS", "PLUGIN_CLIENT_CERT",
		"PLUGIN_UNIX_SOCKET_DIR")) // the private folder of its socket
	g.Expect(env).To(HaveKeyWithValue("PLUGIN_REGION", "eu-1"))
	g.Expect(env).To(HaveKeyWithValue("TMPDIR", dir))
	g.Expect(pluginNamed(h.plugins(t), "env").Env).To(Equal([]string{"ENV_REPORT_FILE", "PLUGIN_REGION"}))
}

// freePorts returns n loopback addresses with free ports.
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

// hostProcess is a kds-host global run as a real process.
type hostProcess struct {
	cmd                    *exec.Cmd
	out                    *syncBuffer
	kdsAddr, apiAddr, diag string
	dataDir                string
	api                    *api.Client // as the global's admin
	exited                 chan struct{}
	waitErr                error
}

// startHost runs `kds-host` (a global, plaintext KDS, free ports) with more args, and waits until
// it is ready. The test's end stops it.
func startHost(t *testing.T, args ...string) *hostProcess {
	t.Helper()
	return startHostEnv(t, nil, args...)
}

// startHostEnv is startHost with env added to the test's environment. Ports are picked free and
// then bound by the process: when another test took one meanwhile, it starts again on others.
func startHostEnv(t *testing.T, env []string, args ...string) *hostProcess {
	t.Helper()
	for attempt := 1; ; attempt++ {
		h := launchHost(t, env, args...)
		err := waitReady(h, 20*time.Second)
		if err != nil && attempt < 3 && strings.Contains(h.out.String(), "address already in use") {
			continue
		}
		NewWithT(t).Expect(err).NotTo(HaveOccurred(), "kds-host did not become ready:\n%s", h.out)
		tok, err := auth.ReadTokenFile(filepath.Join(h.dataDir, auth.AdminTokenFile))
		if err != nil {
			t.Fatalf("the global made no admin token: %v", err)
		}
		h.api.Token = tok
		return h
	}
}

// waitReady waits until the host's /readyz answers 200, it exits, or d passes.
func waitReady(h *hostProcess, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		resp, err := http.Get("http://" + h.diag + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		select {
		case <-h.exited:
			return fmt.Errorf("kds-host exited: %v", h.waitErr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return err
		}
	}
}

// launchHost starts kds-host on free loopback ports, stopped when the test ends.
func launchHost(t *testing.T, env []string, args ...string) *hostProcess {
	t.Helper()
	ports := freePorts(t, 3)
	h := &hostProcess{out: &syncBuffer{}, kdsAddr: ports[0], apiAddr: ports[1], diag: ports[2], dataDir: t.TempDir(), exited: make(chan struct{})}
	h.cmd = exec.Command(testbin.Build(t, "./host/cmd/kds-host"), append([]string{
		"--data-dir", h.dataDir, "--kds-plaintext", "--kds-addr", h.kdsAddr, "--api-addr", h.apiAddr, "--diag-addr", h.diag,
		"--log-level", "debug"}, args...)...)
	h.cmd.Env = append(os.Environ(), env...)
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
			t.Logf("kds-host output:\n%s", h.out.String())
		}
	})
	h.api = &api.Client{BaseURL: "http://" + h.apiAddr, HTTPClient: &http.Client{Timeout: 10 * time.Second}}
	return h
}

// zoneToken mints a zone token on the global and writes it to a file.
func (h *hostProcess) zoneToken(t *testing.T, zone string) string {
	t.Helper()
	var resp controlplane.TokenResponse
	if err := h.api.PostJSON(context.Background(), "/api/tokens/zone", controlplane.TokenRequest{Name: zone}, &resp); err != nil {
		t.Fatal(err)
	}
	return writeFile(t, zone+".token", resp.Token)
}

func (h *hostProcess) plugins(t *testing.T) controlplane.PluginsReport {
	t.Helper()
	var r controlplane.PluginsReport
	if err := h.api.GetJSON(context.Background(), "/api/plugins", &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func (h *hostProcess) zone(t *testing.T) controlplane.ZoneView {
	t.Helper()
	var list struct{ Items []controlplane.ZoneView }
	if err := h.api.GetJSON(context.Background(), "/api/zones", &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) == 0 {
		return controlplane.ZoneView{}
	}
	return list.Items[0]
}

func (h *hostProcess) reloadByAPI(t *testing.T) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+h.apiAddr+"/api/plugins/reload", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+h.api.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

func pluginNamed(r controlplane.PluginsReport, name string) policy.Status {
	for _, p := range r.Items {
		if p.Name == name {
			return p
		}
	}
	return policy.Status{}
}

// alive reports whether a process runs (a zombie does not).
func alive(pid int) bool {
	if pid <= 0 || errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

func TestAWrongChecksumStopsTheHostAtStart(t *testing.T) {
	g := NewWithT(t)
	bin := testbin.Build(t, "./plugins/retry-forcer")
	data, err := os.ReadFile(bin)
	g.Expect(err).NotTo(HaveOccurred())
	actual := fmt.Sprintf("%x", sha256.Sum256(data))
	wrong := strings.Repeat("0", 64)
	ports := freePorts(t, 3)
	cmd := exec.Command(testbin.Build(t, "./host/cmd/kds-host"), "--data-dir", t.TempDir(), "--kds-plaintext",
		"--kds-addr", ports[0], "--api-addr", ports[1], "--diag-addr", ports[2], "--plugin", bin+"@sha256:"+wrong)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	g.Expect(errors.As(err, &exit)).To(BeTrue(), "want a non-zero exit, got %v: %s", err, out)
	g.Expect(exit.ExitCode()).To(Equal(1))
	g.Expect(string(out)).To(ContainSubstring("Error: plugin " + bin + ": checksum mismatch: expected sha256:" + wrong + ", actual sha256:" + actual))
}

// startZone runs an in-process zone against a global whose KDS is at kdsAddr; it refuses every
// Mesh, so the global retries on and on.
func startRejectingZone(t *testing.T, h *hostProcess) *controlplane.Zone {
	t.Helper()
	st, err := store.Open(t.Context(), "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	z, err := controlplane.NewZone(controlplane.ZoneConfig{Store: st, Registry: resource.Default(), APIAddr: "127.0.0.1:0", DiagAddr: "127.0.0.1:0",
		KDS: zone.Config{Zone: "zone-1", GlobalAddress: "grpc://" + h.kdsAddr, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
			TokenFile: h.zoneToken(t, "zone-1"), AdmissionOutage: map[string]time.Duration{"Mesh": time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- z.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("zone: %v", err)
		}
	})
	return z
}

type round struct {
	n     uint32
	delay string
}

// roundsWatch samples the global's retry rounds of zone-1: round number and its delay.
type roundsWatch struct {
	mu     sync.Mutex
	rounds []round
	stop   chan struct{}
	done   chan struct{}
}

func watchRounds(t *testing.T, h *hostProcess) *roundsWatch {
	w := &roundsWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			var list struct{ Items []controlplane.ZoneView }
			if h.api.GetJSON(context.Background(), "/api/zones", &list) != nil || len(list.Items) == 0 || list.Items[0].Retry == nil {
				continue
			}
			r := list.Items[0].Retry
			w.mu.Lock()
			if n := len(w.rounds); r.Round > 0 && (n == 0 || w.rounds[n-1].n != r.Round) {
				w.rounds = append(w.rounds, round{r.Round, r.LastDelay})
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { close(w.stop); <-w.done })
	return w
}

func (w *roundsWatch) latest() round {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.rounds) == 0 {
		return round{}
	}
	return w.rounds[len(w.rounds)-1]
}

func (w *roundsWatch) all() []round {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.rounds)
}

// delaysFrom lists the delays of the rounds numbered from on.
func (w *roundsWatch) delaysFrom(from uint32) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, r := range w.rounds {
		if r.n >= from {
			out = append(out, r.delay)
		}
	}
	return out
}

func TestSwapTheRetryPolicyBySIGHUPAndByTheAPI(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "kds-host.yaml")
	bin := testbin.Build(t, "./plugins/retry-forcer")
	// The built-in policy, the fallback, waits 150ms: a round decided by it would show.
	writeConfig := func(policy string) {
		g.Expect(os.WriteFile(cfgFile, []byte("plugins:\n  - path: "+bin+"\n    config: "+policy+
			"\n  - path: builtin\n    config: {policy: fixed, delay: 150ms}\n"), 0o600)).To(Succeed())
	}
	// Exponential without jitter: 100ms, 200ms, then 400ms every round.
	const exponential = "{policy: exponential, base: 100ms, max: 400ms, jitter: none}"
	writeConfig(exponential)
	// A generous policy deadline: on a loaded machine a decision must not fall back by accident.
	h := startHost(t, "--config", cfgFile, "--policy-timeout", "2s")
	z := startRejectingZone(t, h)
	meshKind, _ := resource.Default().Get("Mesh")
	_, _, err := h.api.Put(context.Background(), meshKind, "", "default", []byte(`{"type":"Mesh","name":"default"}`))
	g.Expect(err).NotTo(HaveOccurred())
	w := watchRounds(t, h)
	g.Eventually(func() uint32 { return w.latest().n }, 10*time.Second).Should(BeNumerically(">=", 4))
	g.Expect(w.delaysFrom(1)).To(HaveEach(BeElementOf("100ms", "200ms", "400ms")))
	stream := h.zone(t).Stream
	g.Expect(stream).NotTo(BeZero())

	// swapped checks that from the second round after the swap on, every round waits want.
	swapped := func(how string, want string) {
		at := w.latest().n
		g.Eventually(func() []string { return w.delaysFrom(at + 2) }, 10*time.Second).Should(HaveLen(3), "%s: rounds %v", how, w.all())
		g.Expect(w.delaysFrom(at+2)).To(HaveEach(want), "%s: rounds %v", how, w.all())
	}

	// SIGHUP: exponential to fixed.
	writeConfig("{policy: fixed, delay: 250ms}")
	pid := pluginNamed(h.plugins(t), "retry-forcer").PID
	g.Expect(h.cmd.Process.Signal(syscall.SIGHUP)).To(Succeed())
	g.Eventually(func() string { return pluginNamed(h.plugins(t), "retry-forcer").Policy }, 10*time.Second).Should(Equal("fixed delay=250ms"))
	g.Expect(h.plugins(t).LastReload.Error).To(BeEmpty())
	g.Expect(pluginNamed(h.plugins(t), "retry-forcer").PID).NotTo(Equal(pid))
	swapped("SIGHUP", "250ms")

	// The API: back to exponential, then to another fixed delay.
	writeConfig(exponential)
	code, body := h.reloadByAPI(t)
	g.Expect(code).To(Equal(http.StatusOK), body)
	swapped("API, to exponential", "400ms")
	writeConfig("{policy: fixed, delay: 300ms}")
	code, body = h.reloadByAPI(t)
	g.Expect(code).To(Equal(http.StatusOK), body)
	var report controlplane.PluginsReport
	g.Expect(json.Unmarshal([]byte(body), &report)).To(Succeed())
	g.Expect(pluginNamed(report, "retry-forcer").Policy).To(Equal("fixed delay=300ms"))
	swapped("API, to fixed", "300ms")

	// A bad document: refused, the running plugin stays.
	writeConfig("{policy: fixed, delay: -1s}")
	before := pluginNamed(h.plugins(t), "retry-forcer")
	code, body = h.reloadByAPI(t)
	g.Expect(code).To(Equal(http.StatusUnprocessableEntity))
	g.Expect(body).To(ContainSubstring(`"title": "Plugin reload failed"`))
	g.Expect(body).To(ContainSubstring("delay: must be \\u003e 0, got -1s"))
	g.Expect(pluginNamed(h.plugins(t), "retry-forcer").PID).To(Equal(before.PID))
	g.Expect(h.plugins(t).LastReload.Error).To(ContainSubstring("delay: must be > 0"))

	// The zone's stream never dropped.
	g.Expect(z.Client.Stats().Sessions).To(Equal(1))
	g.Expect(h.zone(t).Stream).To(Equal(stream))
	g.Expect(h.zone(t).Connected).To(BeTrue())

	// What `kds-host inspect plugins` shows.
	res := runCLI(t, "", "inspect", "plugins", "--cp", "http://"+h.apiAddr, "--data-dir", h.dataDir)
	g.Expect(res.err).NotTo(HaveOccurred(), res.stderr)
	g.Expect(res.stdout).To(MatchRegexp(`(?m)^NAME +PATH +CHECKSUM +VERSION +SERVES +PID +STATE +RESTARTS +CALLS +ERRORS +TIMEOUTS +P50 +P99 +POLICY$`))
	g.Expect(res.stdout).To(MatchRegexp(`(?m)^retry-forcer +` + regexpQuote(bin) + ` +sha256:[0-9a-f]{12} +0\.1\.0 +RetryForcer +\d+ +running +0 +\d+ +0 +0 +\S+ +\S+ +fixed delay=300ms$`))
	g.Expect(res.stdout).To(MatchRegexp(`(?m)^builtin +builtin +- +0\.1\.0 +OwnerCheck,fallback:RetryForcer +- +builtin .* fixed delay=150ms$`))
	g.Expect(res.stdout).To(ContainSubstring("Last reload: "))
	g.Expect(res.stdout).To(ContainSubstring("failed, the running plugins stayed: configure plugin retry-forcer with " + cfgFile))
	res = runCLI(t, "", "inspect", "plugins", "--cp", "http://"+h.apiAddr, "--data-dir", h.dataDir, "-o", "json")
	g.Expect(res.err).NotTo(HaveOccurred(), res.stderr)
	g.Expect(json.Unmarshal([]byte(res.stdout), &report)).To(Succeed())
	g.Expect(report.Total).To(Equal(2))
	g.Expect(report.Items[1].Policy).To(Equal("fixed delay=150ms"))
	g.Expect(report.Config).To(Equal(cfgFile))
	g.Expect(report.Items[0].Calls).To(BeNumerically(">", 0))
}

func regexpQuote(s string) string {
	r := strings.NewReplacer(".", `\.`, "+", `\+`, "(", `\(`, ")", `\)`)
	return r.Replace(s)
}

func TestPluginsDieWithTheHost(t *testing.T) {
	g := NewWithT(t)
	h := startHost(t, "--plugin", testbin.Build(t, "./plugins/retry-forcer"), "--plugin", testbin.Build(t, "./plugins/owner-check"))
	r := h.plugins(t)
	g.Expect(r.Items).To(HaveLen(3))
	var pids []int
	for _, p := range r.Items[:2] {
		g.Expect(p.State).To(Equal(policy.StateRunning))
		g.Expect(alive(p.PID)).To(BeTrue())
		pids = append(pids, p.PID)
	}
	g.Expect(h.out.String()).To(ContainSubstring("kds-host.plugin.owner-check: plugin address"), "a plugin's log lines land in the host's log under its name")

	// Order, not time: once the host is gone, so are its plugins (Pdeathsig), however long the
	// kernel takes; the wait is only a guard against a hang.
	g.Expect(h.cmd.Process.Signal(syscall.SIGKILL)).To(Succeed())
	<-h.exited
	for _, pid := range pids {
		g.Eventually(func() bool { return alive(pid) }, time.Minute, 5*time.Millisecond).Should(BeFalse(), "plugin %d outlived its host", pid)
	}
}

// No answer that needs no token says where this machine keeps a secret: the 401 of the API and
// the status page's /gui/config.json name <data-dir>/admin.token, not the data dir's path (which
// they did). The log of the global, its operator's, does.
func TestUnauthenticatedAnswersRevealNoPath(t *testing.T) {
	g := NewWithT(t)
	h := startHost(t)
	for _, path := range []string{"/meshes", "/api/zones", "/gui/config.json"} {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + h.apiAddr + path)
		g.Expect(err).NotTo(HaveOccurred())
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		g.Expect(string(b)).NotTo(ContainSubstring(h.dataDir), path)
		g.Expect(string(b)).To(ContainSubstring("admin.token"), path)
	}
	g.Eventually(h.out.String, 5*time.Second).Should(ContainSubstring(filepath.Join(h.dataDir, auth.AdminTokenFile)))
}
