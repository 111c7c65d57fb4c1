package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kds-host/kds-host/host/store/pgtest"
)

type config struct {
	Duration time.Duration
	Seed     int64
	Zones    int
	Bin      string
	Out      string
	Verbose  bool

	// SlowZones is how many slow zones the "slow zones" fault starts on each replica (0: no
	// such fault), for SlowZoneHold; BigBytes is the size of the large MeshTrafficPermissions
	// written at the start for them to hold in flight.
	SlowZones    int
	SlowZoneHold time.Duration
	BigBytes     int
	// BadRows makes the "bad row" fault: a row with an unreadable column written straight into
	// PostgreSQL, held, then fixed.
	BadRows bool
}

const replicas = 2

// soak is one run: the processes, the proxies, the writes acknowledged and the faults made.
type soak struct {
	cfg          config
	work         string
	pg           *pgtest.Server
	dsn          string   // the soak's database
	kdsAddrs     []string // each replica's KDS address
	replicas     []*proc
	zones        []*proc
	proxies      [][]*proxy // [zone][replica]
	token        string     // an admin token every replica takes
	rnd          *rand.Rand // the fault schedule's
	log          func(format string, args ...any)
	slowZoneList []slowZone // SlowZones a replica, the first replica's first

	mu        sync.Mutex
	keys      map[string]*keyState                           // by name: what the writes acknowledged
	writes    struct{ acked, ambiguous, refused, probe int } // probe: of acked, the probe's
	faults    map[string]int
	pgDown    bool
	intervals []*interval // every fault's time, in the order they began
	latency   [phases]latencySamples
	slow      slowStats
	bad       badStats
	broken    map[string]badRow // the bad rows not fixed yet, by name
}

// keyState is what the acknowledged writes say of one MeshTimeout: its timeout value, or absent.
// ambiguous: a write to it got no answer (it may or may not have been applied), so only the
// zones' agreement with the global is checked for it.
type keyState struct {
	value     string
	present   bool
	ambiguous bool
}

// The convergence allowed after the last fault, before the run fails.
const convergeWithin = 60 * time.Second

func run(cfg config) (*report, error) {
	if cfg.Zones < 1 {
		return nil, errors.New("-zones must be at least 1")
	}
	for _, b := range []string{"kds-host", "retry-forcer", "owner-check"} {
		if _, err := os.Stat(filepath.Join(cfg.Bin, b)); err != nil {
			return nil, fmt.Errorf("%s not in %s (make build): %w", b, cfg.Bin, err)
		}
	}
	s := &soak{cfg: cfg, keys: map[string]*keyState{}, faults: map[string]int{}, broken: map[string]badRow{},
		slow: slowStats{ended: map[string]int{}, reasons: map[string]string{}}, rnd: rand.New(rand.NewPCG(uint64(cfg.Seed), 1))}
	s.log = func(format string, args ...any) {
		if cfg.Verbose {
			fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
		}
	}
	var err error
	if s.work, err = os.MkdirTemp("", "kds-chaos-"); err != nil {
		return nil, err
	}
	os.Chmod(s.work, 0o755)
	defer s.cleanup()
	if err := s.start(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var writers sync.WaitGroup
	writers.Go(func() { s.write(ctx, rand.New(rand.NewPCG(uint64(cfg.Seed), 2))) })
	writers.Go(func() { s.probe(ctx) })
	s.inject(cfg.Duration)
	cancel()
	writers.Wait()
	healed := time.Now()
	if err := s.heal(); err != nil {
		return nil, err
	}
	return s.check(healed)
}

func (s *soak) cleanup() {
	for _, ps := range s.proxies {
		for _, p := range ps {
			p.close()
		}
	}
	for _, p := range append(slices.Clone(s.zones), s.replicas...) {
		p.signal(false)
		p.kill9()
	}
	if s.pg != nil {
		s.pg.Stop()
	}
	if s.work != "" && !s.cfg.Verbose {
		os.RemoveAll(s.work)
	}
}

// start starts PostgreSQL, the replicas (the first one makes the token key the others take),
// the proxies and the zones, and writes the Mesh.
func (s *soak) start() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	// Durable: PostgreSQL acknowledges a commit once it is in its log, as in production, so that a
	// crash of the server (a fault) cannot take back what a replica acknowledged.
	if s.pg, err = pgtest.StartDurableServer(ctx); err != nil {
		return err
	}
	dsn, _, err := s.pg.CreateDatabase(ctx)
	if err != nil {
		return err
	}
	s.dsn = dsn
	bin := filepath.Join(s.cfg.Bin, "kds-host")
	kdsAddrs := make([]string, replicas)
	for i := range replicas {
		ports := make([]int, 3)
		for j := range ports {
			if ports[j], err = freePort(); err != nil {
				return err
			}
		}
		name := fmt.Sprintf("r%d", i+1)
		kdsAddrs[i] = fmt.Sprintf("127.0.0.1:%d", ports[0])
		p := &proc{name: name, log: filepath.Join(s.work, name+".log"), ready: fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[2]),
			args: []string{"--mode", "global", "--store", dsn, "--data-dir", filepath.Join(s.work, name), "--replica-id", name,
				"--kds-plaintext", "--kds-addr", kdsAddrs[i], "--api-addr", fmt.Sprintf("127.0.0.1:%d", ports[1]), "--diag-addr", fmt.Sprintf("127.0.0.1:%d", ports[2]),
				"--plugin", filepath.Join(s.cfg.Bin, "retry-forcer"), "--plugin", filepath.Join(s.cfg.Bin, "owner-check"), "--log-level", "warn"}}
		if i > 0 {
			p.args = append(p.args, "--token-signing-key", filepath.Join(s.work, "r1", "keys", "token-signing.key"))
		}
		if err := p.start(bin); err != nil {
			return err
		}
		if err := p.waitReady(time.Minute); err != nil {
			return err
		}
		s.replicas = append(s.replicas, p)
	}
	s.kdsAddrs = kdsAddrs
	tok, err := os.ReadFile(filepath.Join(s.work, "r1", "admin.token"))
	if err != nil {
		return err
	}
	s.token = strings.TrimSpace(string(tok))
	if err := s.put(s.api(0), "/meshes/default", `{"type":"Mesh","name":"default"}`); err != nil {
		return fmt.Errorf("write the Mesh: %w", err)
	}
	for j := range s.cfg.Zones {
		name := fmt.Sprintf("zone-%d", j+1)
		var addrs []string
		var ps []*proxy
		for _, a := range kdsAddrs {
			p, err := newProxy(a)
			if err != nil {
				return err
			}
			ps = append(ps, p)
			addrs = append(addrs, "grpc://"+p.addr())
		}
		s.proxies = append(s.proxies, ps)
		tokenFile := filepath.Join(s.work, name+".token")
		tok, err := s.mintZoneToken(name)
		if err != nil {
			return err
		}
		if err := os.WriteFile(tokenFile, []byte(tok+"\n"), 0o600); err != nil {
			return err
		}
		apiPort, err := freePort()
		if err != nil {
			return err
		}
		diagPort, err := freePort()
		if err != nil {
			return err
		}
		if j%2 == 1 { // every other zone lists the replicas the other way round: both serve zones
			slices.Reverse(addrs)
		}
		z := &proc{name: name, log: filepath.Join(s.work, name+".log"), ready: fmt.Sprintf("http://127.0.0.1:%d/readyz", diagPort),
			args: []string{"--mode", "zone", "--zone-name", name, "--data-dir", filepath.Join(s.work, name), "--zone-token-file", tokenFile,
				"--global-address", strings.Join(addrs, ","), "--api-addr", fmt.Sprintf("127.0.0.1:%d", apiPort),
				"--diag-addr", fmt.Sprintf("127.0.0.1:%d", diagPort), "--log-level", "warn"}}
		if err := z.start(bin); err != nil {
			return err
		}
		if err := z.waitReady(time.Minute); err != nil {
			return err
		}
		s.zones = append(s.zones, z)
	}
	if s.cfg.SlowZones > 0 {
		return s.prepareSlowZones()
	}
	return nil
}

// mintZoneToken makes a zone token for name, as an operator does, with the CLI on r1's data.
func (s *soak) mintZoneToken(name string) (string, error) {
	out, err := exec.Command(filepath.Join(s.cfg.Bin, "kds-host"), "token", "zone", "--name", name, "--cp", "http://"+s.api(0),
		"--data-dir", filepath.Join(s.work, "r1")).Output()
	if err != nil {
		return "", fmt.Errorf("mint %s's token: %w", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// api is replica i's API address; zoneAPI zone j's.
func (s *soak) api(i int) string     { return argAfter(s.replicas[i].args, "--api-addr") }
func (s *soak) zoneAPI(j int) string { return argAfter(s.zones[j].args, "--api-addr") }

func argAfter(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// outcome is what a write's answer says: applied, not applied, or unknown.
type outcome int

const (
	applied outcome = iota
	notApplied
	unknown
)

// call sends one API request to addr and says whether it was applied.
func (s *soak) call(method, addr, path, body string) (outcome, []byte) {
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		return notApplied, nil
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpJSON.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return notApplied, nil // nothing listened: nothing was received
		}
		return unknown, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	switch {
	case resp.StatusCode < 300:
		return applied, b
	case resp.StatusCode < 500:
		return notApplied, b
	default:
		return unknown, b // a store that failed mid-commit may have committed
	}
}

func (s *soak) put(addr, path, body string) error {
	for range 100 {
		if o, b := s.call(http.MethodPut, addr, path, body); o == applied {
			return nil
		} else if o == notApplied && len(b) > 0 {
			return fmt.Errorf("PUT %s: %s", path, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("PUT %s: no replica took it", path)
}

func timeoutDoc(name, value string) string {
	return fmt.Sprintf(`{"type":"MeshTimeout","mesh":"default","name":%q,"spec":{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":%q}}}`, name, value)
}

// write makes writes through random replicas, one at a time, until ctx ends, and records what
// each answer says.
func (s *soak) write(ctx context.Context, rnd *rand.Rand) {
	seq, created := 0, 0
	for ctx.Err() == nil {
		seq++
		addr := s.api(rnd.IntN(replicas))
		value := fmt.Sprintf("%ds", seq)
		s.mu.Lock()
		var existing []string
		for n, k := range s.keys {
			if k.present && strings.HasPrefix(n, "c-") { // not the probe's, nor the bad rows
				existing = append(existing, n)
			}
		}
		s.mu.Unlock()
		sort.Strings(existing)
		pick := func() string {
			if len(existing) == 0 || rnd.IntN(2) == 0 {
				created++
				return fmt.Sprintf("c-%06d", created)
			}
			return existing[rnd.IntN(len(existing))]
		}
		switch op := rnd.IntN(100); {
		case op < 70: // create or update one
			name := pick()
			o, _ := s.call(http.MethodPut, addr, "/meshes/default/meshtimeouts/"+name, timeoutDoc(name, value))
			s.record(name, value, true, o)
		case op < 85 && len(existing) > 0: // delete one
			name := existing[rnd.IntN(len(existing))]
			o, b := s.call(http.MethodDelete, addr, "/meshes/default/meshtimeouts/"+name, "")
			if o == notApplied && strings.Contains(string(b), "not found") {
				o = applied // already absent: the delete's effect holds
			}
			s.record(name, "", false, o)
		default: // a batch
			n := 2 + rnd.IntN(4)
			names, items := make([]string, n), make([]string, n)
			for i := range n {
				names[i] = pick()
				if slices.Contains(names[:i], names[i]) {
					created++
					names[i] = fmt.Sprintf("c-%06d", created)
				}
				items[i] = timeoutDoc(names[i], value)
			}
			o, b := s.call(http.MethodPost, addr, "/api/apply", `{"items":[`+strings.Join(items, ",")+`]}`)
			var resp struct {
				Items []struct {
					Error *json.RawMessage `json:"error"`
				} `json:"items"`
			}
			if o == applied && json.Unmarshal(b, &resp) == nil && len(resp.Items) == n {
				for i, it := range resp.Items {
					if it.Error != nil {
						s.record(names[i], value, true, notApplied)
					} else {
						s.record(names[i], value, true, applied)
					}
				}
			} else {
				for _, name := range names {
					s.record(name, value, true, o)
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// record applies a write's answer to what is known of name.
func (s *soak) record(name, value string, present bool, o outcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[name]
	if k == nil {
		k = &keyState{}
		s.keys[name] = k
	}
	switch o {
	case applied:
		s.writes.acked++
		k.value, k.present = value, present
	case unknown:
		s.writes.ambiguous++
		k.ambiguous = true
	default:
		s.writes.refused++
	}
}

// The faults, and how long each lasts before it heals; slow zones and bad rows come when the
// config has them.
var faultKinds = []string{"kill replica", "kill zone", "kill plugin", "stop postgres", "stall connection", "reset connection",
	"drop connection", "delay connection", "SIGSTOP replica", "slow zones", "bad row"}

// kinds are the faults this run's schedule draws from.
func (s *soak) kinds() []string {
	var out []string
	for _, k := range faultKinds {
		if (k == "slow zones" && s.cfg.SlowZones <= 0) || (k == "bad row" && !s.cfg.BadRows) {
			continue
		}
		out = append(out, k)
	}
	return out
}

// zoneFaults are the faults that target one zone (its process or its connection to a replica);
// the others reach every zone.
var zoneFaults = []string{"kill zone", "stall connection", "reset connection", "drop connection", "delay connection"}

// inject makes a random fault every 1 to 3 s for d, each healed after 0.5 to 3 s (slow zones
// after SlowZoneHold, a bad row after 2 to 8 s). One fault at a time.
func (s *soak) inject(d time.Duration) {
	kinds := s.kinds()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		time.Sleep(time.Duration(1000+s.rnd.IntN(2000)) * time.Millisecond)
		kind := kinds[s.rnd.IntN(len(kinds))]
		hold := time.Duration(500+s.rnd.IntN(2500)) * time.Millisecond
		r, z := s.rnd.IntN(replicas), s.rnd.IntN(len(s.zones))
		switch kind {
		case "slow zones":
			hold = s.cfg.SlowZoneHold
		case "bad row":
			hold = time.Duration(2000+s.rnd.IntN(6000)) * time.Millisecond
		}
		s.log("fault: %s (r%d, zone-%d) for %s", kind, r+1, z+1, hold)
		target := -1
		if slices.Contains(zoneFaults, kind) {
			target = z
		}
		iv := s.begin(kind, target)
		switch kind {
		case "kill replica":
			s.restart(s.replicas[r], hold)
		case "kill zone":
			s.restart(s.zones[z], hold)
		case "kill plugin":
			plugins := children(s.replicas[r].pid(), "retry-forcer")
			plugins = append(plugins, children(s.replicas[r].pid(), "owner-check")...)
			pick := s.rnd.IntN(1 << 20) // drawn whatever is found: the schedule stays the seed's
			if len(plugins) > 0 {
				syscall.Kill(plugins[pick%len(plugins)], syscall.SIGKILL) // the replica's supervisor starts it again
			}
		case "stop postgres":
			s.mu.Lock()
			s.pgDown = true
			s.mu.Unlock()
			if err := s.pg.Halt(); err != nil {
				s.log("halt postgres: %v", err)
			}
			time.Sleep(hold)
			s.resumePG()
		case "stall connection", "drop connection", "delay connection":
			p := s.proxies[z][r]
			p.set(map[string]proxyMode{"stall connection": stall, "drop connection": drop, "delay connection": delay}[kind])
			time.Sleep(hold)
			p.set(forward)
		case "reset connection":
			s.proxies[z][r].reset()
		case "SIGSTOP replica":
			s.replicas[r].signal(true)
			time.Sleep(hold)
			s.replicas[r].signal(false)
		case "slow zones":
			s.slowZones(hold)
		case "bad row":
			s.badRowFault(s.rnd.IntN(2) == 0, hold)
		}
		s.finish(iv)
	}
}

// restart kills p at once and starts it again after hold.
func (s *soak) restart(p *proc, hold time.Duration) {
	p.kill9()
	time.Sleep(hold)
	p.mu.Lock()
	p.restarts++
	p.mu.Unlock()
	if err := p.start(filepath.Join(s.cfg.Bin, "kds-host")); err != nil {
		s.log("restart %s: %v", p.name, err)
	}
}

func (s *soak) resumePG() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.pg.Resume(ctx); err != nil {
		s.log("resume postgres: %v", err)
		return
	}
	s.mu.Lock()
	s.pgDown = false
	s.mu.Unlock()
}

// heal undoes whatever is left: every proxy forwards, PostgreSQL runs, every process runs.
func (s *soak) heal() error {
	for _, ps := range s.proxies {
		for _, p := range ps {
			p.set(forward)
		}
	}
	s.mu.Lock()
	down := s.pgDown
	s.mu.Unlock()
	if down {
		s.resumePG()
	}
	for _, p := range append(slices.Clone(s.replicas), s.zones...) {
		p.signal(false)
		if !p.running() {
			if err := p.start(filepath.Join(s.cfg.Bin, "kds-host")); err != nil {
				return err
			}
		}
	}
	for _, p := range append(slices.Clone(s.replicas), s.zones...) {
		if err := p.waitReady(time.Minute); err != nil {
			return err
		}
	}
	s.fixBroken()
	return nil
}

// stored is one MeshTimeout as an API lists it.
type stored struct {
	Name       string `json:"name"`
	Generation int64  `json:"generation"`
	Spec       struct {
		Default struct {
			ConnectionTimeout string `json:"connectionTimeout"`
		} `json:"default"`
	} `json:"spec"`
}

// list reads the MeshTimeouts of mesh default from an API; dups are the names listed twice.
func (s *soak) list(addr string) (map[string]stored, []string, error) {
	o, b := s.call(http.MethodGet, addr, "/meshes/default/meshtimeouts", "")
	if o != applied {
		return nil, nil, fmt.Errorf("list at %s: %s", addr, b)
	}
	var l struct {
		Items []stored `json:"items"`
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, nil, err
	}
	out := map[string]stored{}
	var dups []string
	for _, it := range l.Items {
		if _, twice := out[it.Name]; twice {
			dups = append(dups, it.Name)
		}
		out[it.Name] = it
	}
	return out, dups, nil
}

// check waits until every zone holds what the global holds, and compares the global with the
// writes acknowledged.
func (s *soak) check(healed time.Time) (*report, error) {
	rep := &report{cfg: s.cfg, faults: s.faults, restarts: map[string]int{}, convergenceDeadline: convergeWithin}
	s.mu.Lock()
	rep.acked, rep.ambiguous, rep.refused, rep.probe = s.writes.acked, s.writes.ambiguous, s.writes.refused, s.writes.probe
	rep.latency, rep.slow, rep.bad = s.latency, s.slow, s.bad
	rep.unfixed = slices.Sorted(maps.Keys(s.broken))
	s.mu.Unlock()
	for _, p := range append(slices.Clone(s.replicas), s.zones...) {
		rep.restarts[p.name] = p.restarts
	}
	global, dups, err := s.list(s.api(0))
	if err != nil {
		return rep, err
	}
	rep.resources = len(global)
	rep.duplicated = append(rep.duplicated, dups...)
	for name, k := range s.keys {
		if k.ambiguous {
			rep.unsure++
			continue
		}
		rep.checked++
		got, ok := global[name]
		switch {
		case k.present && !ok:
			rep.lost = append(rep.lost, fmt.Sprintf("%s: acknowledged with %s, absent from the global", name, k.value))
		case k.present && got.Spec.Default.ConnectionTimeout != k.value:
			rep.lost = append(rep.lost, fmt.Sprintf("%s: acknowledged with %s, the global holds %s", name, k.value, got.Spec.Default.ConnectionTimeout))
		case !k.present && ok:
			rep.lost = append(rep.lost, fmt.Sprintf("%s: deleted (acknowledged), the global still holds it", name))
		}
	}
	sort.Strings(rep.lost)
	rep.converge = make([]time.Duration, len(s.zones))
	for j := range s.zones {
		var last string
		for {
			zone, zdups, err := s.list(s.zoneAPI(j))
			if err == nil {
				diff := compare(global, zone)
				if len(diff) == 0 {
					rep.converge[j] = time.Since(healed)
					rep.duplicated = append(rep.duplicated, zdups...)
					break
				}
				last = strings.Join(diff[:min(len(diff), 5)], "; ")
			} else {
				last = err.Error()
			}
			if time.Since(healed) > convergeWithin {
				rep.notConverged = true
				rep.mismatched = append(rep.mismatched, fmt.Sprintf("%s: %s", s.zones[j].name, last))
				rep.converge[j] = convergeWithin
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return rep, nil
}

// compare says how zone differs from global: names missing, extra or at another generation or
// content.
func compare(global, zone map[string]stored) []string {
	var out []string
	for n, g := range global {
		z, ok := zone[n]
		switch {
		case !ok:
			out = append(out, n+" missing")
		case z.Generation != g.Generation || z.Spec.Default.ConnectionTimeout != g.Spec.Default.ConnectionTimeout:
			out = append(out, fmt.Sprintf("%s at generation %d (%s), the global's %d (%s)", n, z.Generation, z.Spec.Default.ConnectionTimeout, g.Generation, g.Spec.Default.ConnectionTimeout))
		}
	}
	for n := range zone {
		if _, ok := global[n]; !ok {
			out = append(out, n+" extra")
		}
	}
	sort.Strings(out)
	return out
}
