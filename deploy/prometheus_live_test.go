package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
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
func firing(prom string) ([]promAlert, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + prom + "/api/v1/alerts")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	var out []promAlert
	for _, a := range body.Data.Alerts {
		if a.State == "firing" {
			out = append(out, a)
		}
	}
	return out, nil
}

// startAgain starts a stopped (or reserved) host again on its ports and data directory, from
// any goroutine: it returns the host and why it is not ready.
func startAgain(t *testing.T, bin string, old *host, args ...string) (*host, error) {
	h, err := startProcess(t, bin, old, args...)
	if err != nil {
		return h, err
	}
	return h, h.waitReady(patience)
}

// startUnready is startAgain for a zone that cannot connect: it waits for /healthz only (a
// zone's /readyz waits for its global).
func startUnready(t *testing.T, bin string, old *host, args ...string) (*host, error) {
	h, err := startProcess(t, bin, old, args...)
	if err != nil {
		return h, err
	}
	client := &http.Client{Timeout: 2 * time.Second}
	return h, waitFor(func() bool {
		resp, err := client.Get("http://" + h.diag + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func startProcess(t *testing.T, bin string, old *host, args ...string) (*host, error) {
	h := &host{kds: old.kds, api: old.api, diag: old.diag, dataDir: old.dataDir, out: &syncBuffer{}, exited: make(chan struct{})}
	h.cmd = exec.Command(bin, append([]string{"--data-dir", h.dataDir, "--api-addr", h.api, "--diag-addr", h.diag}, args...)...)
	h.cmd.Stdout, h.cmd.Stderr = h.out, h.out
	if err := h.cmd.Start(); err != nil {
		h.cmd = nil
		return h, err
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
	})
	return h, nil
}

// stop stops a host, if it was started, and waits for it.
func (h *host) stop() {
	if h.cmd == nil {
		return
	}
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	<-h.exited
}

// span is a time an alert was firing; to is zero while it still fires.
type span struct{ from, to time.Time }

// alertLog is every alert Prometheus reported firing, polled by the test's goroutine (poll), and
// read by the faults' goroutines.
type alertLog struct {
	mu     sync.Mutex
	spans  map[string][]span // promAlert.String() -> its spans, in order
	labels map[string]map[string]string
}

func newAlertLog() *alertLog {
	return &alertLog{spans: map[string][]span{}, labels: map[string]map[string]string{}}
}

// poll records what fires now.
func (l *alertLog) poll(prom string) error {
	as, err := firing(prom)
	if err != nil {
		return err
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := map[string]bool{}
	for _, a := range as {
		k := a.String()
		seen[k] = true
		l.labels[k] = a.Labels
		ss := l.spans[k]
		if len(ss) == 0 || !ss[len(ss)-1].to.IsZero() {
			l.spans[k] = append(ss, span{from: now})
		}
	}
	for k, ss := range l.spans {
		if last := &ss[len(ss)-1]; last.to.IsZero() && !seen[k] {
			last.to = now
		}
	}
	return nil
}

// matcher names an alert: its alertname and the labels it must have.
type matcher struct {
	name   string
	labels map[string]string
}

func alert(name string, kv ...string) matcher {
	m := matcher{name: name, labels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		m.labels[kv[i]] = kv[i+1]
	}
	return m
}

func (m matcher) match(labels map[string]string) bool {
	if labels["alertname"] != m.name {
		return false
	}
	for k, v := range m.labels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func (m matcher) String() string {
	ls := maps.Clone(m.labels)
	ls["alertname"] = m.name
	return promAlert{Labels: ls}.String()
}

// since returns the alerts matching pred with their spans that lasted past from.
func (l *alertLog) since(from time.Time, pred func(map[string]string) bool) map[string][]span {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string][]span{}
	for k, ss := range l.spans {
		if !pred(l.labels[k]) {
			continue
		}
		for _, s := range ss {
			if s.to.IsZero() || s.to.After(from) {
				out[k] = append(out[k], s)
			}
		}
	}
	return out
}

// firingNow returns the alerts matching pred firing at the last poll.
func (l *alertLog) firingNow(pred func(map[string]string) bool) []string {
	var out []string
	for k, ss := range l.since(time.Now(), pred) {
		if ss[len(ss)-1].to.IsZero() {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// fault is one fault a track causes: it must make each of want fire, and each resolve once heal
// has run (or on its own before, for an alert on an increase over a window). Meanwhile only the
// alerts named in allow may fire among those of its scope: its cluster's alerts of its zones
// (a zone label among zones, or the instance of one of its zone processes) and, when global,
// those of no zone (the global's, the cluster's).
type fault struct {
	name      string
	cluster   string
	zones     []string
	instances []string
	global    bool
	want      []matcher
	allow     []string // alert names
	alone     []string // alert names of want that resolve on their own before heal
	atMost    int      // alerts besides want at most (0: any number of those allowed)
	cause     func() error
	// hold waits, after every want fired, before heal (default: 4 minutes of the rules' time,
	// for the consequences that would page too).
	hold func(l *alertLog) error
	heal func() error
}

// scope reports whether an alert belongs to the fault; zoneInstances are the instances of every
// zone process the test runs.
func (f *fault) scope(zoneInstances map[string]bool) func(map[string]string) bool {
	return func(ls map[string]string) bool {
		if ls["cluster"] != f.cluster {
			return false
		}
		if z, ok := ls["zone"]; ok {
			return slices.Contains(f.zones, z)
		}
		if i := ls["instance"]; zoneInstances[i] {
			return slices.Contains(f.instances, i)
		}
		return f.global
	}
}

// row is one line of the table: a fault, an alert it fired, and when.
type row struct {
	fault, alert    string
	fired, resolved time.Duration
	resolvedAlone   bool // before heal, this long after firing
	others          []string
}

func (r row) String() string {
	resolved := r.resolved.Round(100 * time.Millisecond).String()
	if r.resolvedAlone {
		resolved = "on its own, " + resolved + " after firing"
	}
	others := "none"
	if len(r.others) > 0 {
		others = strings.Join(r.others, ", ")
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %s |", r.fault, r.alert, r.fired.Round(100*time.Millisecond), resolved, others)
}

// run causes f, waits for its alerts to fire and, once healed, to resolve, and checks what else
// fired. It returns the table's rows.
func (f *fault) run(l *alertLog, zoneInstances map[string]bool) ([]row, error) {
	inScope := f.scope(zoneInstances)
	began := time.Now()
	if err := f.cause(); err != nil {
		return nil, fmt.Errorf("%s: cause: %w", f.name, err)
	}
	first := func(m matcher) (string, span, bool) {
		var key string
		var sp span
		for k, ss := range l.since(began, func(ls map[string]string) bool { return inScope(ls) && m.match(ls) }) {
			if s := ss[0]; key == "" || s.from.Before(sp.from) {
				key, sp = k, s
			}
		}
		return key, sp, key != ""
	}
	if err := waitFor(func() bool {
		for _, m := range f.want {
			if _, _, ok := first(m); !ok {
				return false
			}
		}
		return true
	}); err != nil {
		_ = f.heal() // what the cause started ends with the fault
		return nil, fmt.Errorf("%s: %v did not fire (firing: %v)", f.name, f.want, l.firingNow(inScope))
	}
	if f.hold != nil {
		if err := f.hold(l); err != nil {
			_ = f.heal()
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
	} else {
		time.Sleep(4 * minute)
	}
	// Until healed, each alert of want fires (but those that resolve on their own).
	for _, m := range f.want {
		firingNow := len(l.firingNow(func(ls map[string]string) bool { return inScope(ls) && m.match(ls) })) > 0
		if firingNow == slices.Contains(f.alone, m.name) {
			_ = f.heal()
			return nil, fmt.Errorf("%s: before heal, %v firing: %v (firing: %v)", f.name, m, firingNow, l.firingNow(inScope))
		}
	}
	healed := time.Now()
	if err := f.heal(); err != nil {
		return nil, fmt.Errorf("%s: heal: %w", f.name, err)
	}
	wanted := func(ls map[string]string) bool {
		return slices.ContainsFunc(f.want, func(m matcher) bool { return m.match(ls) })
	}
	if err := waitFor(func() bool {
		return len(l.firingNow(func(ls map[string]string) bool { return inScope(ls) && wanted(ls) })) == 0
	}); err != nil {
		return nil, fmt.Errorf("%s: still firing after heal: %v", f.name, l.firingNow(inScope))
	}
	var others []string
	for k := range l.since(began, func(ls map[string]string) bool { return inScope(ls) && !wanted(ls) }) {
		others = append(others, k)
	}
	slices.Sort(others)
	var rows []row
	for _, m := range f.want {
		key, sp, _ := first(m)
		r := row{fault: f.name, alert: key, fired: sp.from.Sub(began), others: others}
		ss := l.since(began, func(ls map[string]string) bool { return promAlert{Labels: ls}.String() == key })[key]
		end := ss[len(ss)-1].to
		if end.Before(healed) {
			r.resolved, r.resolvedAlone = end.Sub(sp.from), true
		} else {
			r.resolved = end.Sub(healed)
		}
		rows = append(rows, r)
	}
	var unexpected []string
	for _, o := range others {
		if !slices.Contains(f.allow, strings.SplitN(o, "{", 2)[0]) {
			unexpected = append(unexpected, o)
		}
	}
	if len(unexpected) > 0 {
		return rows, fmt.Errorf("%s: fired besides %v: %v (allowed: %v)", f.name, f.want, unexpected, f.allow)
	}
	if f.atMost > 0 && len(others) > f.atMost {
		return rows, fmt.Errorf("%s: %d alerts fired besides %v, at most %d allowed: %v", f.name, len(others), f.want, f.atMost, others)
	}
	// Settle: nothing of the fault's scope fires before the track's next fault.
	if err := waitFor(func() bool { return len(l.firingNow(inScope)) == 0 }); err != nil {
		return rows, fmt.Errorf("%s: still firing once healed: %v", f.name, l.firingNow(inScope))
	}
	return rows, nil
}

// waitFor polls cond every 250ms for 3 minutes at most (the longest fault takes 1.5 to fire).
func waitFor(cond func() bool) error {
	deadline := time.Now().Add(3 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("not within 3 minutes")
		}
		time.Sleep(250 * time.Millisecond)
	}
	return nil
}

// track is faults caused one after another; tracks run at once.
type track []*fault
