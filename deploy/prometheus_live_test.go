package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.yaml.in/yaml/v3"

	"github.com/kds-host/kds-host/host/store/pgtest"
	"github.com/kds-host/kds-host/internal/testbin"
)

// minute is what a minute of the rules (their for: and range windows) becomes for the real
// Prometheus test: the rules keep their shape, on a clock 20 times faster.
const minute = 3 * time.Second

// prometheusBinary is Debian's prometheus (the package that brings promtool). Without it the
// test is skipped with what to install, or fails when CI is set.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("prometheus")
	if err != nil {
		msg := "prometheus is not installed: `make test-deps` installs it (Debian's prometheus package: apt-get install prometheus)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}

var (
	rangeRE = regexp.MustCompile(`\[(\d+)([mh])\]`)
	forRE   = regexp.MustCompile(`^(\d+)([mh])$`)
)

// shortened is d ("5", "m") on the test's clock, in whole seconds.
func shortened(n, unit string) string {
	v, _ := strconv.Atoi(n)
	if unit == "h" {
		v *= 60
	}
	return fmt.Sprintf("%ds", int(time.Duration(v)*minute/time.Second))
}

// shortenedRules is the mixin's rendering with every for: and range window on the test's clock.
func shortenedRules(t *testing.T) string {
	t.Helper()
	rendered, _ := mixin(t, "{}")
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(rendered), &doc); err != nil {
		t.Fatal(err)
	}
	for _, grp := range doc["groups"].([]any) {
		for _, r := range grp.(map[string]any)["rules"].([]any) {
			rule := r.(map[string]any)
			rule["expr"] = rangeRE.ReplaceAllStringFunc(rule["expr"].(string), func(s string) string {
				m := rangeRE.FindStringSubmatch(s)
				return "[" + shortened(m[1], m[2]) + "]"
			})
			if f, ok := rule["for"].(string); ok {
				m := forRE.FindStringSubmatch(f)
				if m == nil {
					t.Fatalf("for: %q", f)
				}
				rule["for"] = shortened(m[1], m[2])
			}
		}
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// promAlert is one alert of Prometheus's /api/v1/alerts.
type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

func (a promAlert) String() string {
	var ls []string
	for k, v := range a.Labels {
		if k != "alertname" && k != "severity" {
			ls = append(ls, k+"="+v)
		}
	}
	slices.Sort(ls)
	return a.Labels["alertname"] + "{" + strings.Join(ls, ",") + "}"
}

// firing asks Prometheus for the alerts firing now.
func firing(t *testing.T, prom string) []promAlert {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + prom + "/api/v1/alerts")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	var out []promAlert
	for _, a := range body.Data.Alerts {
		if a.State == "firing" {
			out = append(out, a)
		}
	}
	return out
}

// relaunch starts a stopped host again on its ports and data directory.
func relaunch(t *testing.T, name, bin string, old *host, args ...string) *host {
	t.Helper()
	h, err := startAgain(t, bin, old, args...)
	if err != nil {
		t.Fatalf("%s did not become ready again: %v\n%s", name, err, h.out)
	}
	return h
}

// startAgain is relaunch for any goroutine: it returns the host and why it is not ready.
func startAgain(t *testing.T, bin string, old *host, args ...string) (*host, error) {
	h := &host{kds: old.kds, api: old.api, diag: old.diag, dataDir: old.dataDir, out: &syncBuffer{}, exited: make(chan struct{})}
	h.cmd = exec.Command(bin, append([]string{"--data-dir", h.dataDir, "--api-addr", h.api, "--diag-addr", h.diag}, args...)...)
	h.cmd.Stdout, h.cmd.Stderr = h.out, h.out
	if err := h.cmd.Start(); err != nil {
		return h, err
	}
	go func() {
		h.waitErr = h.cmd.Wait()
		close(h.exited)
	}()
	t.Cleanup(func() {
		_ = h.cmd.Process.Signal(syscall.SIGTERM)
		<-h.exited
	})
	return h, h.waitReady(patience)
}

// stop stops a host and waits for it.
func (h *host) stop() {
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	<-h.exited
}

// A real Prometheus, loading the mixin's rules on a clock 20 times faster (a minute of for: or
// range is 3 s; scrapes every second with a 1 s timeout), scrapes a global on PostgreSQL with
// both reference plugins and two zones. A healthy fleet fires nothing; a hung PostgreSQL fires
// KDSStoreNotReady and no zone alert, at most two alerts in all; a zone that stops fires
// KDSHostDown for its process alone; a name the zone parks fires KDSZoneBehind alone, until it
// is fixed; the global stopped fires KDSHostDown alone; the global on an empty database fires
// KDSZoneBlocked, at most two alerts in all; a crash-looping zone fires KDSZoneDisconnected (and
// at most KDSZoneFlapping besides). Each resolves once the fault is gone. The table of times is
// logged.
func TestARealPrometheusFiresOneAlertPerFault(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the real Prometheus test takes a minute or two")
	}
	prometheus := prometheusBinary(t)
	if pgtest.Skipped() {
		t.Skipf("%s=1: skipping PostgreSQL test", pgtest.EnvSkip)
	}
	g := NewWithT(t)
	srv, err := pgtest.StartServer(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { g.Expect(srv.Stop()).To(Succeed()) })
	dsn := srv.Database(t)

	kdsHost := testbin.Build(t, "./host/cmd/kds-host")
	plugins := []string{"--plugin", testbin.Build(t, "./plugins/retry-forcer"), "--plugin", testbin.Build(t, "./plugins/owner-check")}
	global := startHost(t, "global", kdsHost, append([]string{"--store", dsn}, plugins...)...)
	t.Cleanup(func() { _ = srv.Thaw() }) // before the global stops
	globalArgs := func(dsn string) []string {
		return append([]string{"--kds-plaintext", "--kds-addr", global.kds, "--store", dsn}, plugins...)
	}
	zoneArgs := func(name, token string) []string {
		return []string{"--mode", "zone", "--zone-name", name, "--global-address", "grpc://" + global.kds, "--zone-token-file", token}
	}
	token2 := global.zoneToken(t, "zone-2")
	// zone-1's admission refuses, as INVALID, what carries the deny label: the global parks it.
	zone1 := startHost(t, "zone-1", kdsHost, append(zoneArgs("zone-1", global.zoneToken(t, "zone-1")),
		"--admission-deny-label", "kds-host.test/deny=yes")...)
	zone2 := startHost(t, "zone-2", kdsHost, zoneArgs("zone-2", token2)...)

	dir := t.TempDir()
	g.Expect(os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(shortenedRules(t)), 0o644)).To(Succeed())
	config := fmt.Sprintf(`global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}
rule_files: [rules.yaml]
scrape_configs:
  - job_name: kds-host-global
    static_configs: [{targets: [%q]}]
  - job_name: kds-host-zone
    static_configs: [{targets: [%q, %q]}]
`, global.diag, zone1.diag, zone2.diag)
	g.Expect(os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644)).To(Succeed())
	prom := freePorts(t, 1)[0]
	cmd := exec.Command(prometheus, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+prom, "--log.level=warn")
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	g.Expect(cmd.Start()).To(Succeed())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus output:\n%s", out)
		}
	})
	g.Eventually(func() error {
		resp, err := http.Get("http://" + prom + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("%s", resp.Status)
			}
		}
		return err
	}, patience, 100*time.Millisecond).Should(Succeed())

	// Healthy: every rule's window filled (the longest, an hour, is 3 minutes here: a fifth of it),
	// nothing fires.
	healthy := 12 * minute
	t.Logf("healthy fleet for %s (%s of the rules' time)", healthy, healthy/minute*time.Minute)
	g.Consistently(func() []promAlert { return firing(t, prom) }, healthy, 500*time.Millisecond).Should(BeEmpty())

	var table []string
	// fault causes a fault, waits for want to fire and, once heal ran, to resolve; it returns
	// every other alert that fired meanwhile.
	fault := func(name, want string, cause, heal func()) []string {
		t.Helper()
		others := map[string]bool{}
		began := time.Now()
		cause()
		var fired, resolved time.Duration
		watch := func(done func([]promAlert) bool) {
			g.Eventually(func() bool {
				as := firing(t, prom)
				for _, a := range as {
					if a.String() != want {
						others[a.String()] = true
					}
				}
				return done(as)
			}, patience, 250*time.Millisecond).Should(BeTrue(), "%s: %s", name, want)
		}
		has := func(as []promAlert) bool {
			return slices.ContainsFunc(as, func(a promAlert) bool { return a.String() == want })
		}
		watch(has)
		fired = time.Since(began)
		// A little longer, for the consequences that would page too.
		deadline := time.Now().Add(4 * minute)
		watch(func([]promAlert) bool { return time.Now().After(deadline) })
		healed := time.Now()
		heal()
		watch(func(as []promAlert) bool { return !has(as) })
		resolved = time.Since(healed)
		var list []string
		for a := range others {
			list = append(list, a)
		}
		slices.Sort(list)
		table = append(table, fmt.Sprintf("| %s | %s | %s | %s | %s |", name, want, fired.Round(100*time.Millisecond),
			resolved.Round(100*time.Millisecond), strings.Join(list, ", ")))
		return list
	}

	others := fault("PostgreSQL hung (SIGSTOP)", "KDSStoreNotReady{instance="+global.diag+",job=kds-host-global}",
		func() { g.Expect(srv.Freeze()).To(Succeed()) },
		func() { g.Expect(srv.Thaw()).To(Succeed()) })
	g.Expect(len(others)).To(BeNumerically("<=", 1), "at most two alerts for a hung store: %v", others)
	for _, a := range others {
		g.Expect(a).NotTo(HavePrefix("KDSZone"), "no per-zone alert for a hung store")
	}

	others = fault("zone-2 stopped", "KDSHostDown{instance="+zone2.diag+",job=kds-host-zone}",
		func() { zone2.stop() },
		func() { zone2 = relaunch(t, "zone-2", kdsHost, zone2, zoneArgs("zone-2", token2)...) })
	g.Expect(others).To(BeEmpty(), "a stopped zone pages once, as its process down")

	apply := func(doc string) {
		t.Helper()
		out, err := exec.Command(kdsHost, "apply", "-f", writeFile(t, "resources.yaml", doc), "--cp", "http://"+global.api, "--data-dir", global.dataDir).CombinedOutput()
		g.Expect(err).NotTo(HaveOccurred(), "kds-host apply:\n%s", out)
	}
	const timeout = "type: MeshTimeout\nmesh: default\nname: parked\nspec:\n  targetRef: {kind: Mesh}\n  default: {connectionTimeout: 2s}\n"
	others = fault("a MeshTimeout zone-1 refuses as INVALID (parked)", "KDSZoneBehind{kind=MeshTimeout,reason=parked,zone=zone-1}",
		func() {
			apply("type: Mesh\nname: default\n---\n" + timeout + "labels:\n  kds-host.test/deny: \"yes\"\n")
		},
		func() { apply(timeout) })
	g.Expect(others).To(BeEmpty(), "a parked name pages once")

	others = fault("the global stopped", "KDSHostDown{instance="+global.diag+",job=kds-host-global}",
		func() { global.stop() },
		func() { global = relaunch(t, "global", kdsHost, global, globalArgs(dsn)...) })
	g.Expect(others).To(BeEmpty(), "a global down pages once")

	// The global refuses to start on an empty store it did not serve; --accept-new-store is the
	// operator who accepts the wrong one (or a replica started without its data directory).
	others = fault("the global restarted on an empty database (accepted)", "KDSZoneBlocked{}",
		func() {
			global.stop()
			global = relaunch(t, "global", kdsHost, global, append(globalArgs(srv.Database(t)), "--accept-new-store")...)
		},
		func() {
			global.stop()
			global = relaunch(t, "global", kdsHost, global, append(globalArgs(dsn), "--accept-new-store")...)
		})
	g.Expect(len(others)).To(BeNumerically("<=", 1), "at most two alerts for a wrong store: %v", others)

	// zone-2 crash-loops: down 3.5 s, up 1.5 s (70 s and 30 s of the rules' time), until healed.
	var loop struct {
		stop, done chan struct{}
		err        error
	}
	others = fault("zone-2 crash-looping", "KDSZoneDisconnected{zone=zone-2}",
		func() {
			loop.stop, loop.done = make(chan struct{}), make(chan struct{})
			go func() {
				defer close(loop.done)
				for {
					zone2.stop()
					select {
					case <-loop.stop:
					case <-time.After(minute * 70 / 60):
					}
					if zone2, loop.err = startAgain(t, kdsHost, zone2, zoneArgs("zone-2", token2)...); loop.err != nil {
						return
					}
					select {
					case <-loop.stop:
						return
					case <-time.After(minute / 2):
					}
				}
			}()
		},
		func() {
			close(loop.stop)
			<-loop.done
			g.Expect(loop.err).NotTo(HaveOccurred(), "zone-2 did not start again")
		})
	for _, a := range others {
		g.Expect(a).To(Equal("KDSZoneFlapping{zone=zone-2}"), "a crash-looping zone pages once, and may warn that it flaps")
	}

	t.Logf("the real Prometheus's table (a minute of the rules is %s):\n| fault | alert | to firing | to resolved | other alerts firing |\n|---|---|---|---|---|\n%s",
		minute, strings.Join(table, "\n"))
}
