package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/store/pgtest"
	"github.com/kds-host/kds-host/internal/testbin"
)

// cluster is a global and its zones under one cluster label: the rules keep the label, so the
// clusters' faults run at once without one masking another's alerts.
type cluster struct {
	name   string
	bin    string // kds-host
	global *host
	args   []string         // the global's arguments (its store, its plugins)
	zones  map[string]*host // zone name -> its process, scraped from the start
	dir    string           // files the faults write
	files  atomic.Int64
	admin  *api.Client
}

// startCluster starts a global with args, applies a Mesh and a MeshTimeout, and starts the
// zones named, each with a token of its own.
func startCluster(t *testing.T, name, bin string, args []string, zones ...string) *cluster {
	t.Helper()
	c := &cluster{name: name, bin: bin, args: args, zones: map[string]*host{}, dir: t.TempDir()}
	c.global = startHost(t, name+"/global", bin, args...)
	admin, err := auth.ReadTokenFile(filepath.Join(c.global.dataDir, auth.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	c.admin = &api.Client{BaseURL: "http://" + c.global.api, HTTPClient: &http.Client{Timeout: 10 * time.Second}, Token: admin}
	if err := c.apply("type: Mesh\nname: default\n---\ntype: MeshTimeout\nmesh: default\nname: base\nspec:\n  targetRef: {kind: Mesh}\n  default: {connectionTimeout: 1s}\n"); err != nil {
		t.Fatal(err)
	}
	for _, z := range zones {
		c.zones[z] = startHost(t, name+"/"+z, bin, c.zoneArgs(z, c.global.zoneToken(t, z))...)
	}
	return c
}

// globalArgs are the global's arguments to start it again.
func (c *cluster) globalArgs(extra ...string) []string {
	return append(append([]string{"--kds-plaintext", "--kds-addr", c.global.kds}, c.args...), extra...)
}

func (c *cluster) zoneArgs(name, token string, extra ...string) []string {
	return append([]string{"--mode", "zone", "--zone-name", name, "--global-address", "grpc://" + c.global.kds, "--zone-token-file", token}, extra...)
}

// file writes content to a new file of the cluster's.
func (c *cluster) file(name, content string) (string, error) {
	path := filepath.Join(c.dir, fmt.Sprintf("%d-%s", c.files.Add(1), name))
	return path, os.WriteFile(path, []byte(content), 0o600)
}

// apply runs kds-host apply on the cluster's global.
func (c *cluster) apply(doc string) error {
	path, err := c.file("resources.yaml", doc)
	if err != nil {
		return err
	}
	out, err := exec.Command(c.bin, "apply", "-f", path, "--cp", "http://"+c.global.api, "--data-dir", c.global.dataDir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kds-host apply: %v\n%s", err, out)
	}
	return nil
}

// delete runs kds-host delete on the cluster's global.
func (c *cluster) delete(kind, name string) error {
	out, err := exec.Command(c.bin, "delete", kind, name, "-m", "default", "--cp", "http://"+c.global.api, "--data-dir", c.global.dataDir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kds-host delete: %v\n%s", err, out)
	}
	return nil
}

// restartZone stops a zone and starts it again at once with args (down well under the 2
// minutes of KDSHostDown).
func (c *cluster) restartZone(t *testing.T, zone string, args ...string) error {
	c.zones[zone].stop()
	h, err := startAgain(t, c.bin, c.zones[zone], args...)
	c.zones[zone] = h
	return err
}

// newTimeout is a MeshTimeout document named name, new to the zones.
func newTimeout(name string) string {
	return "type: MeshTimeout\nmesh: default\nname: " + name + "\nspec:\n  targetRef: {kind: Mesh}\n  default: {connectionTimeout: 5s}\n"
}

// reserve is a host not started yet: its ports and data directory.
func reserve(t *testing.T) *host {
	ports := freePorts(t, 3)
	return &host{kds: ports[0], api: ports[1], diag: ports[2], dataDir: t.TempDir()}
}

// lateTargets are the zones Prometheus scrapes once started (file_sd: a zone scraped before it
// runs would be down).
type lateTargets struct {
	mu      sync.Mutex
	path    string
	targets []map[string]any
}

func (l *lateTargets) add(cluster, diag string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.targets = append(l.targets, map[string]any{"targets": []string{diag}, "labels": map[string]string{"cluster": cluster}})
	return l.write()
}

func (l *lateTargets) write() error {
	b, err := json.Marshal(l.targets)
	if err != nil {
		return err
	}
	tmp := l.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, l.path)
}

// pluginPID is the process id of the global's plugin named name.
func (c *cluster) pluginPID(name string) (int, error) {
	var report controlplane.PluginsReport
	if err := c.admin.GetJSON(context.Background(), "/api/plugins", &report); err != nil {
		return 0, err
	}
	for _, p := range report.Items {
		if p.Name == name && p.PID > 0 {
			return p.PID, nil
		}
	}
	return 0, fmt.Errorf("no running plugin %s: %+v", name, report.Items)
}

// reload asks the global to reload its plugins.
func (c *cluster) reload() error {
	return c.admin.PostJSON(context.Background(), "/api/plugins/reload", struct{}{}, nil)
}

// sql runs statements on a connection to dsn.
func sql(dsn string, stmts ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// promQuery returns the value of a PromQL expression with one result (0 for none).
func promQuery(prom, expr string) (float64, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + prom + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, err
	}
	if len(body.Data.Result) == 0 {
		return 0, nil
	}
	v, _ := body.Data.Result[0].Value[1].(string)
	return strconv.ParseFloat(v, 64)
}

func dbName(dsn string) string {
	u, _ := url.Parse(dsn)
	return strings.TrimPrefix(u.Path, "/")
}

// A real Prometheus, loading the mixin's rules on a clock 20 times faster (a minute of for: or
// range is 3 s; scrapes every second with a 1 s timeout), scrapes several clusters at once, each
// a global with its zones under its own cluster label (the rules aggregate by it). One cluster is
// a healthy fleet, watched for the whole test (over 3 minutes) and never firing anything. In the
// others, tracks of faults run at once, each fault after the last one's alerts resolved; each
// fault fires its alert, and at most the companions its runbook section names, and each alert
// resolves once the fault is healed (or, on an increase over a window, on its own). The table of
// times is logged.
func TestARealPrometheusFiresOneAlertPerFault(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the real Prometheus test takes minutes")
	}
	prometheus := prometheusBinary(t)
	if pgtest.Skipped() {
		t.Skipf("%s=1: skipping PostgreSQL test", pgtest.EnvSkip)
	}
	g := NewWithT(t)
	began := time.Now()
	// Two PostgreSQL servers: cluster a's hangs (SIGSTOP of every server process).
	srvA, err := pgtest.StartServer(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { g.Expect(srvA.Stop()).To(Succeed()) })
	srvB, err := pgtest.StartServer(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { g.Expect(srvB.Stop()).To(Succeed()) })

	kdsHost := testbin.Build(t, "./host/cmd/kds-host")
	retryForcer, ownerCheck := testbin.Build(t, "./plugins/retry-forcer"), testbin.Build(t, "./plugins/owner-check")
	failingOwnerCheck := testbin.Build(t, "./deploy/testdata/failing-owner-check")
	plugins := []string{"--plugin", retryForcer, "--plugin", ownerCheck}
	dir := t.TempDir()
	late := &lateTargets{path: filepath.Join(dir, "late-zones.json")}
	g.Expect(late.write()).To(Succeed())

	control := startCluster(t, "control", kdsHost, append([]string{"--store", srvB.Database(t)}, plugins...), "control-1", "control-2")
	var tracks []track
	clusters := []*cluster{control}
	zoneInstances := map[string]bool{}
	for _, build := range []func() (*cluster, []track){
		func() (*cluster, []track) { return clusterA(t, srvA, kdsHost, plugins) },
		func() (*cluster, []track) { return clusterB(t, srvB, kdsHost, retryForcer, ownerCheck) },
		func() (*cluster, []track) { return clusterN(t, srvB, kdsHost, retryForcer, ownerCheck) },
		func() (*cluster, []track) { return clusterS(t, srvB, kdsHost, plugins, late, zoneInstances) },
		func() (*cluster, []track) {
			return clusterP(t, srvB, kdsHost, retryForcer, ownerCheck, failingOwnerCheck)
		},
	} {
		c, ts := build()
		clusters = append(clusters, c)
		tracks = append(tracks, ts...)
	}

	var globals, zones []string
	for _, c := range clusters {
		globals = append(globals, fmt.Sprintf("{targets: [%q], labels: {cluster: %s}}", c.global.diag, c.name))
		for _, z := range c.zones {
			zoneInstances[z.diag] = true
			zones = append(zones, fmt.Sprintf("{targets: [%q], labels: {cluster: %s}}", z.diag, c.name))
		}
	}
	g.Expect(os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(shortenedRules(t)), 0o644)).To(Succeed())
	config := fmt.Sprintf(`global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}
rule_files: [rules.yaml]
scrape_configs:
  - job_name: kds-host-global
    static_configs: [%s]
  - job_name: kds-host-zone
    static_configs: [%s]
    file_sd_configs: [{files: [%q], refresh_interval: 1s}]
`, strings.Join(globals, ", "), strings.Join(zones, ", "), late.path)
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
	// Every target scraped, and each counter's first samples taken (an increase counts from
	// them), before the first fault.
	targets := len(globals) + len(zones)
	g.Eventually(func() (float64, error) { return promQuery(prom, "count(up == 1)") }, patience, 250*time.Millisecond).Should(BeNumerically("==", targets))
	time.Sleep(2 * minute)
	setUp := time.Since(began)

	// The tracks run at once; this goroutine polls Prometheus's alerts for them all.
	l := newAlertLog()
	g.Expect(l.poll(prom)).To(Succeed())
	watched := time.Now()
	type result struct {
		rows []row
		errs []error
	}
	results := make([]result, len(tracks))
	var wg sync.WaitGroup
	for i, tr := range tracks {
		wg.Go(func() {
			for _, f := range tr {
				rows, err := f.run(l, zoneInstances)
				results[i].rows = append(results[i].rows, rows...)
				if err != nil {
					results[i].errs = append(results[i].errs, err)
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	// The healthy fleet is watched for 3 minutes at least, and for as long as the faults last.
	healthy := 3 * time.Minute
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	pollErrs := 0
	for finished := false; !finished || time.Since(watched) < healthy; {
		select {
		case <-done:
			finished = true
			done = nil
		case <-tick.C:
			if err := l.poll(prom); err != nil {
				pollErrs++
				g.Expect(pollErrs).To(BeNumerically("<", 20), "Prometheus's alerts: %v", err)
			}
		}
	}
	g.Expect(l.poll(prom)).To(Succeed())

	var table []string
	for _, r := range results {
		for _, row := range r.rows {
			table = append(table, row.String())
		}
		for _, err := range r.errs {
			t.Error(err)
		}
	}
	healthyFired := l.since(watched, func(ls map[string]string) bool { return ls["cluster"] == control.name })
	g.Expect(healthyFired).To(BeEmpty(), "the healthy fleet fired alerts")
	t.Logf("the healthy fleet (cluster %s) fired nothing for %s", control.name, time.Since(watched).Round(time.Second))
	t.Logf("the real Prometheus's table (a minute of the rules is %s; set-up %s, faults %s):\n| fault | alert | to firing | to resolved | other alerts firing |\n|---|---|---|---|---|\n%s",
		minute, setUp.Round(time.Second), time.Since(watched).Round(time.Second), strings.Join(table, "\n"))
}

// Cluster a: a global on PostgreSQL (server A) with both reference plugins and two zones;
// zone-1's admission refuses, as INVALID, what carries the deny label. One track, since most of
// its faults are the whole cluster's: PostgreSQL hung, zone-2 stopped, a name parked, the global
// stopped, the global on an empty database, zone-2 crash-looping.
func clusterA(t *testing.T, srv *pgtest.Server, kdsHost string, plugins []string) (*cluster, []track) {
	dsn, empty := srv.Database(t), srv.Database(t)
	c := startCluster(t, "a", kdsHost, append([]string{"--store", dsn}, plugins...))
	t.Cleanup(func() { _ = srv.Thaw() }) // before the global stops
	token1, token2 := c.global.zoneToken(t, "zone-1"), c.global.zoneToken(t, "zone-2")
	c.zones["zone-1"] = startHost(t, "a/zone-1", kdsHost, c.zoneArgs("zone-1", token1, "--admission-deny-label", "kds-host.test/deny=yes")...)
	c.zones["zone-2"] = startHost(t, "a/zone-2", kdsHost, c.zoneArgs("zone-2", token2)...)
	zone2 := func() string { return c.zones["zone-2"].diag }
	startGlobal := func(args []string) error {
		c.global.stop()
		h, err := startAgain(t, kdsHost, c.global, args...)
		c.global = h
		return err
	}
	const timeout = "type: MeshTimeout\nmesh: default\nname: parked\nspec:\n  targetRef: {kind: Mesh}\n  default: {connectionTimeout: 2s}\n"
	var loop struct {
		stop, done chan struct{}
		err        error
	}
	return c, []track{{
		{name: "PostgreSQL hung (every server process SIGSTOPped)", cluster: "a", global: true, atMost: 1,
			want:  []matcher{alert("KDSStoreNotReady", "instance", c.global.diag)},
			allow: []string{"KDSHostDown", "KDSStoreListenDown"},
			cause: srv.Freeze, heal: srv.Thaw},
		{name: "a zone process stopped", cluster: "a", zones: []string{"zone-2"}, instances: []string{zone2()},
			want:  []matcher{alert("KDSHostDown", "instance", zone2())},
			cause: func() error { c.zones["zone-2"].stop(); return nil },
			heal:  func() error { return c.restartZone(t, "zone-2", c.zoneArgs("zone-2", token2)...) }},
		{name: "a MeshTimeout zone-1 refuses as INVALID (parked)", cluster: "a", zones: []string{"zone-1", "zone-2"},
			want:  []matcher{alert("KDSZoneBehind", "zone", "zone-1", "kind", "MeshTimeout", "reason", "parked")},
			cause: func() error { return c.apply(timeout + "labels:\n  kds-host.test/deny: \"yes\"\n") },
			heal:  func() error { return c.apply(timeout) }},
		{name: "the global stopped", cluster: "a", global: true, zones: []string{"zone-1", "zone-2"},
			want:  []matcher{alert("KDSHostDown", "instance", c.global.diag)},
			cause: func() error { c.global.stop(); return nil },
			heal:  func() error { return startGlobal(c.globalArgs()) }},
		// The global refuses to start on an empty store it did not serve; --accept-new-store is
		// the operator who accepts the wrong one (or a replica started without its data directory).
		{name: "the global restarted on an empty database, accepted", cluster: "a", global: true, zones: []string{"zone-1", "zone-2"}, atMost: 1,
			want:  []matcher{alert("KDSZoneBlocked")},
			allow: []string{"KDSHostDown", "KDSStoreNotReady"},
			cause: func() error {
				return startGlobal(append(append([]string{"--kds-plaintext", "--kds-addr", c.global.kds, "--store", empty}, plugins...), "--accept-new-store"))
			},
			heal: func() error { return startGlobal(c.globalArgs("--accept-new-store")) }},
		// zone-2 crash-loops: down 3.5 s, up 1.5 s (70 s and 30 s of the rules' time), until healed.
		{name: "zone-2 crash-looping (3.5 s down, 1.5 s up)", cluster: "a", zones: []string{"zone-2"}, instances: []string{zone2()},
			want:  []matcher{alert("KDSZoneDisconnected", "zone", "zone-2")},
			allow: []string{"KDSZoneFlapping"},
			cause: func() error {
				loop.stop, loop.done = make(chan struct{}), make(chan struct{})
				go func() {
					defer close(loop.done)
					// Prometheus sees the zone down from its stop until its diagnostics address
					// answers: the next stop is that much shorter, or a slow start (a loaded CI
					// machine) would make the 3.5 s a KDSHostDown's 6.
					var starting time.Duration
					for {
						c.zones["zone-2"].stop()
						select {
						case <-loop.stop:
						case <-time.After(max(0, minute*70/60-starting)):
						}
						t0 := time.Now()
						h, err := startUnready(t, kdsHost, c.zones["zone-2"], c.zoneArgs("zone-2", token2)...)
						starting = time.Since(t0)
						c.zones["zone-2"] = h
						if err == nil {
							err = h.waitReady(patience)
						}
						if loop.err = err; err != nil {
							return
						}
						select {
						case <-loop.stop:
							return
						case <-time.After(minute / 2):
						}
					}
				}()
				return nil
			},
			heal: func() error {
				close(loop.stop)
				<-loop.done
				return loop.err
			}},
	}}
}

// Cluster b: a global whose retry policy gives up after one round (maxAttempts 1; an INVALID
// name would be parked only after 10 sends) and one zone whose admission refuses, as INVALID,
// what carries the deny label. A name given up keeps KDSZoneBehind (given_up) firing after
// KDSRetryGaveUp, an alert on the give-up's increase, has resolved on its own, until the name
// reaches the zone; then an owner that exists nowhere withholds a name (REJECT).
func clusterB(t *testing.T, srv *pgtest.Server, kdsHost, retryForcer, ownerCheck string) (*cluster, []track) {
	config := writeFile(t, "plugins.yaml", fmt.Sprintf("plugins:\n  - path: %s\n    config: {maxAttempts: 1, invalidAttempts: 10}\n  - path: %s\n", retryForcer, ownerCheck))
	c := startCluster(t, "b", kdsHost, []string{"--store", srv.Database(t), "--config", config})
	c.zones["b-1"] = startHost(t, "b/b-1", kdsHost, c.zoneArgs("b-1", c.global.zoneToken(t, "b-1"), "--admission-deny-label", "kds-host.test/deny=yes")...)
	const refused = "type: MeshTimeout\nmesh: default\nname: refused\nspec:\n  targetRef: {kind: Mesh}\n  default: {connectionTimeout: 2s}\n"
	gaveUp := alert("KDSRetryGaveUp", "zone", "b-1")
	behind := alert("KDSZoneBehind", "zone", "b-1", "kind", "MeshTimeout", "reason", "given_up")
	return c, []track{{
		{name: "a MeshTimeout zone b-1 refuses as INVALID, given up by the retry policy", cluster: "b", zones: []string{"b-1"},
			want:  []matcher{gaveUp, behind},
			alone: []string{"KDSRetryGaveUp"},
			cause: func() error { return c.apply(refused + "labels:\n  kds-host.test/deny: \"yes\"\n") },
			// KDSRetryGaveUp resolves on its own once the give-up has left its window; the name
			// is still missing, and KDSZoneBehind keeps firing (3 minutes of the rules' time more).
			hold: func(l *alertLog) error {
				inB := func(m matcher) func(map[string]string) bool {
					return func(ls map[string]string) bool { return ls["cluster"] == "b" && m.match(ls) }
				}
				if err := waitFor(func() bool { return len(l.firingNow(inB(gaveUp))) == 0 }); err != nil {
					return fmt.Errorf("KDSRetryGaveUp did not resolve on its own")
				}
				for end := time.Now().Add(3 * minute); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
					if len(l.firingNow(inB(behind))) == 0 {
						return fmt.Errorf("KDSZoneBehind (given_up) resolved while the name is still missing on the zone")
					}
				}
				return nil
			},
			heal: func() error { return c.apply(refused) }},
		{name: "a MeshTimeout whose owner exists nowhere (REJECT)", cluster: "b", zones: []string{"b-1"},
			want: []matcher{alert("KDSResourcesWithheldForLong", "zone", "b-1", "kind", "MeshTimeout", "verdict", "REJECT")},
			cause: func() error {
				return c.apply("type: MeshTimeout\nmesh: default\nname: orphan\nowners:\n  - {kind: MeshRetry, mesh: default, name: nowhere}\nspec:\n  targetRef: {kind: Mesh}\n  default: {connectionTimeout: 3s}\n")
			},
			heal: func() error { return c.delete("meshtimeout", "orphan") }},
	}}
}

// Cluster n: a global whose retry policy has no backoff (fixed, 200ms) and one zone, whose
// admission of MeshTimeout is made not ready (restarted with an outage): a NACK storm.
func clusterN(t *testing.T, srv *pgtest.Server, kdsHost, retryForcer, ownerCheck string) (*cluster, []track) {
	config := writeFile(t, "plugins.yaml", fmt.Sprintf("plugins:\n  - path: %s\n    config: {policy: fixed, delay: 200ms}\n  - path: %s\n", retryForcer, ownerCheck))
	c := startCluster(t, "n", kdsHost, []string{"--store", srv.Database(t), "--config", config}, "n-1")
	token := c.global.zoneToken(t, "n-1")
	return c, []track{{
		{name: "zone n-1's admission of MeshTimeout not ready, the retry policy without backoff", cluster: "n", zones: []string{"n-1"}, instances: []string{c.zones["n-1"].diag},
			want:  []matcher{alert("KDSNACKStorm", "zone", "n-1")},
			allow: []string{"KDSZoneBehind"},
			cause: func() error {
				if err := c.restartZone(t, "n-1", c.zoneArgs("n-1", token, "--admission-outage", "MeshTimeout=10m")...); err != nil {
					return err
				}
				return c.apply(newTimeout("storm"))
			},
			heal: func() error { return c.restartZone(t, "n-1", c.zoneArgs("n-1", token)...) }},
	}}
}

// Cluster s: a global on PostgreSQL with both reference plugins. The global's track: a row it
// cannot encode (unservable), its LISTEN connection lost (the database refuses connections),
// a zone whose token names another zone (streams refused). At once, zone by zone: a zone whose
// admission of MeshTimeout stays not ready (keeps rejecting), a zone started with a wrong global
// address, then a second process under an existing zone's name (flapping), and a zone client
// that asks again for a name it holds in a loop (re-requests limited).
func clusterS(t *testing.T, srv *pgtest.Server, kdsHost string, plugins []string, late *lateTargets, zoneInstances map[string]bool) (*cluster, []track) {
	dsn := srv.Database(t)
	db := pgx.Identifier{dbName(dsn)}.Sanitize()
	t.Cleanup(func() { _ = sql(srv.AdminDSN(), "ALTER DATABASE "+db+" ALLOW_CONNECTIONS true") })
	c := startCluster(t, "s", kdsHost, append([]string{"--store", dsn}, plugins...), "s-slow", "s-flap")
	tokens := map[string]string{}
	for _, z := range []string{"s-slow", "s-flap", "s-lost", "s-bad", "s-loop", "s-other"} {
		tokens[z] = c.global.zoneToken(t, z)
	}
	lost, bad, dup := reserve(t), reserve(t), reserve(t)
	zoneInstances[lost.diag], zoneInstances[bad.diag] = true, true
	loop, err := startLoopingZone(c.global.kds, "s-loop", tokens["s-loop"], 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := loop.stop(); err != nil {
			t.Errorf("the looping zone: %v", err)
		}
	})
	// start starts a late zone, stopping it first when it runs; it cannot connect when unready.
	start := func(h **host, unready bool, args ...string) error {
		(*h).stop()
		run := startAgain
		if unready {
			run = startUnready
		}
		started, err := run(t, kdsHost, *h, args...)
		*h = started
		return err
	}
	const timeout = "type: MeshTimeout\nmesh: default\nname: unservable\nspec:\n  targetRef: {kind: Mesh}\n  default: {connectionTimeout: 4s}\n"
	return c, []track{
		{
			{name: "a stored MeshTimeout the global cannot encode", cluster: "s", global: true,
				want: []matcher{alert("KDSUnservableResources", "kind", "MeshTimeout")},
				cause: func() error {
					// Written past the API's validation, as a manual fix of the database would.
					st, err := store.Open(context.Background(), dsn, "")
					if err != nil {
						return err
					}
					defer st.Close()
					_, _, err = st.Put(context.Background(), resource.Resource{Kind: "MeshTimeout", Mesh: "default", Name: "unservable", Spec: json.RawMessage(`[1]`)})
					return err
				},
				heal: func() error { return c.apply(timeout) }},
			{name: "the global's LISTEN connection cut, the database refusing new connections", cluster: "s", global: true,
				want: []matcher{alert("KDSStoreListenDown", "instance", c.global.diag)},
				cause: func() error {
					return sql(srv.AdminDSN(), "ALTER DATABASE "+db+" ALLOW_CONNECTIONS false",
						fmt.Sprintf("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '%s' AND datname = '%s'", store.ListenApplicationName, dbName(dsn)))
				},
				heal: func() error { return sql(srv.AdminDSN(), "ALTER DATABASE "+db+" ALLOW_CONNECTIONS true") }},
			{name: "zone s-bad started with another zone's token", cluster: "s", global: true, zones: []string{"s-bad"}, instances: []string{bad.diag},
				want:  []matcher{alert("KDSStreamsRefused", "instance", c.global.diag, "reason", "permission_denied")},
				allow: []string{"KDSZoneCannotReachGlobal"},
				cause: func() error {
					if err := start(&bad, true, c.zoneArgs("s-bad", tokens["s-other"])...); err != nil {
						return err
					}
					return late.add("s", bad.diag)
				},
				heal: func() error { return start(&bad, false, c.zoneArgs("s-bad", tokens["s-bad"])...) }},
		},
		{
			{name: "zone s-slow's admission of MeshTimeout not ready for long", cluster: "s", zones: []string{"s-slow"}, instances: []string{c.zones["s-slow"].diag},
				want:  []matcher{alert("KDSZoneKeepsRejecting", "zone", "s-slow", "kind", "MeshTimeout")},
				allow: []string{"KDSZoneBehind"},
				cause: func() error {
					if err := c.restartZone(t, "s-slow", c.zoneArgs("s-slow", tokens["s-slow"], "--admission-outage", "MeshTimeout=10m")...); err != nil {
						return err
					}
					return c.apply(newTimeout("slow"))
				},
				heal: func() error { return c.restartZone(t, "s-slow", c.zoneArgs("s-slow", tokens["s-slow"])...) }},
		},
		{
			{name: "zone s-lost started with a wrong global address", cluster: "s", zones: []string{"s-lost"}, instances: []string{lost.diag},
				want: []matcher{alert("KDSZoneCannotReachGlobal", "zone", "s-lost")},
				cause: func() error {
					args := c.zoneArgs("s-lost", tokens["s-lost"])
					args[5] = "grpc://" + c.global.api // the API's port, not KDS's
					if err := start(&lost, true, args...); err != nil {
						return err
					}
					return late.add("s", lost.diag)
				},
				heal: func() error { return start(&lost, false, c.zoneArgs("s-lost", tokens["s-lost"])...) }},
			{name: "a second process started as zone s-flap", cluster: "s", zones: []string{"s-flap"}, instances: []string{c.zones["s-flap"].diag},
				want:  []matcher{alert("KDSZoneFlapping", "zone", "s-flap")},
				cause: func() error { return start(&dup, false, c.zoneArgs("s-flap", tokens["s-flap"])...) },
				heal:  func() error { dup.stop(); return nil }},
		},
		{
			{name: "a zone client asking again for a name it holds, in a loop", cluster: "s", zones: []string{"s-loop"},
				want:  []matcher{alert("KDSReRequestsLimited", "zone", "s-loop")},
				cause: func() error { return loop.loop(true) },
				heal:  func() error { return loop.loop(false) }},
		},
	}
}

// Cluster p: a global with its plugins in a --config file (a copy of retry-forcer of its own,
// the owner check) and one zone. One track, the plugins' faults being the global's: the
// retry-forcer process killed (restarted), a reload with a policy document it refuses, a build
// of the owner check whose every call fails while resources change, and retry-forcer's binary
// replaced by one that does not start, then its process killed (down).
func clusterP(t *testing.T, srv *pgtest.Server, kdsHost, retryForcer, ownerCheck, failingOwnerCheck string) (*cluster, []track) {
	dir := t.TempDir()
	rf := filepath.Join(dir, "retry-forcer")
	b, err := os.ReadFile(retryForcer)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rf, b, 0o755); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "plugins.yaml")
	writeConfig := func(policy, oc string) error {
		return os.WriteFile(config, []byte(fmt.Sprintf("plugins:\n  - path: %s\n    config: %s\n  - path: %s\n", rf, policy, oc)), 0o644)
	}
	const good = "{policy: exponential}"
	if err := writeConfig(good, ownerCheck); err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, "p", kdsHost, []string{"--store", srv.Database(t), "--config", config}, "p-1")
	kill := func() error {
		pid, err := c.pluginPID("retry-forcer")
		if err != nil {
			return err
		}
		return syscall.Kill(pid, syscall.SIGKILL)
	}
	var churn struct {
		stop, done chan struct{}
		err        error
	}
	return c, []track{{
		{name: "retry-forcer's process killed", cluster: "p", global: true,
			want:  []matcher{alert("KDSPluginRestarting", "plugin", "retry-forcer")},
			cause: kill,
			heal:  func() error { return nil }},
		{name: "a plugin reload with a policy document retry-forcer refuses", cluster: "p", global: true,
			want: []matcher{alert("KDSPluginReloadFailed", "instance", c.global.diag)},
			cause: func() error {
				if err := writeConfig("{policy: nonsense}", ownerCheck); err != nil {
					return err
				}
				if err := c.reload(); err == nil {
					return fmt.Errorf("the reload of a bad policy document succeeded")
				}
				return nil
			},
			heal: func() error {
				if err := writeConfig(good, ownerCheck); err != nil {
					return err
				}
				return c.reload()
			}},
		{name: "a build of the owner check whose every call fails, while resources change", cluster: "p", global: true, zones: []string{"p-1"},
			want: []matcher{alert("KDSOwnerCheckFailingOpen", "zone", "p-1"), alert("KDSPluginCallsFailing", "plugin", "owner-check", "method", "Predict")},
			cause: func() error {
				if err := writeConfig(good, failingOwnerCheck); err != nil {
					return err
				}
				if err := c.reload(); err != nil {
					return err
				}
				churn.stop, churn.done = make(chan struct{}), make(chan struct{})
				go func() {
					defer close(churn.done)
					for i := 0; ; i++ {
						select {
						case <-churn.stop:
							return
						case <-time.After(500 * time.Millisecond):
						}
						doc := fmt.Sprintf("type: MeshTimeout\nmesh: default\nname: churn\nspec:\n  targetRef: {kind: Mesh}\n  default: {connectionTimeout: %dms}\n", 1000+i)
						if churn.err = c.apply(doc); churn.err != nil {
							return
						}
					}
				}()
				return nil
			},
			heal: func() error {
				close(churn.stop)
				<-churn.done
				if churn.err != nil {
					return churn.err
				}
				if err := writeConfig(good, ownerCheck); err != nil {
					return err
				}
				return c.reload()
			}},
		{name: "retry-forcer's binary replaced by one that does not start, its process killed", cluster: "p", global: true,
			want:  []matcher{alert("KDSPluginDown", "plugin", "retry-forcer")},
			allow: []string{"KDSPluginRestarting"}, // once the binary is back
			cause: func() error {
				if err := os.Rename(rf, rf+".good"); err != nil {
					return err
				}
				if err := os.WriteFile(rf, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
					return err
				}
				return kill()
			},
			heal: func() error { return os.Rename(rf+".good", rf) }},
	}}
}
