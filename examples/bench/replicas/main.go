// Command replicas measures global replicas sharing one PostgreSQL, each replica a process of
// its own (this program, re-run as -replica), on a throwaway PostgreSQL server:
//
//  1. a write through replica A's API reaching a zone stream on replica B (NOTIFY, heard by the
//     changes relay's hub and passed on), over -writes writes: p50, p90, max;
//
//  2. kill -9 of the replica a zone control plane is connected to, -rounds times: how long until
//     the zone is connected to another replica, until it holds the 5 writes made meanwhile, and
//     what the new replica sent it (kds_resources_sent_total): exactly the 5 changed resources,
//     nothing unchanged, or the program fails;
//
//  3. fan-out: a write through A reaching every stream of -zones zones on one replica (the others
//     stopped), then of -zones zones on each of 3 replicas, -fanout-runs times: p50 of each, and
//     the CPU per write of each replica, of the zones' process and of PostgreSQL (the postmaster
//     and its backends, from /proc): the busiest replica's against the single replica's (the
//     issue's limit 1.15x), PostgreSQL's with three replicas against one; and the three replicas'
//     once more with the changes relay off (each replica LISTENs), the baseline of the same run.
//     Beside PostgreSQL's CPU, the statements and rows it executed a write (pg_stat_statements,
//     which the throwaway server preloads), net of idle: the same count with one replica and
//     three says any difference in its CPU a write is the same work on busier cores.
//
//  4. reconnect storm: -storm-zones zones spread evenly over the three replicas, each a raw delta
//     xDS client (a child process, -storm-fleet) that remembers what it holds and resumes as a
//     kds-host zone does (initial_resource_versions per type, the next address, host/zone's
//     jittered backoff); one replica is killed (kill -9) and its zones move to the two others.
//     For each rate of -storm-arrival-rate (the replicas' --kds-arrival-rate), with nothing
//     changed and with -storm-changes resources changed right after the kill, -storm-runs times
//     (interleaved; each run kills another replica): (a) from the kill until each moved zone is
//     served by a survivor and until it holds (ACKed) what the zones on the survivors hold, p50,
//     p99, max; (b) the bytes sent to the moved zones after they moved against a full sync of
//     what they hold, and of them the resources they held already (the limit: 5 % of a full
//     sync when nothing changed, nothing they held); (c) writes through a survivor at
//     -storm-write-rate a second timed until every zone on the survivors holds them, before the
//     kill (the baseline) and during the storm (the limit: p99 under 1 s); (d) the survivors'
//     and PostgreSQL's CPU over both windows.
//
//     go run ./examples/bench/replicas [-sections 1,2,3] [-writes 20] [-rounds 3] [-zones 300] [-fanout-writes 100] [-fanout-runs 3] [-replica-procs N]
//     go run ./examples/bench/replicas -sections 4 [-storm-zones 1000] [-storm-runs 1] [-storm-arrival-rate 0,200] [-storm-changes 5] [-storm-write-rate 5] [-storm-baseline 10s]
//
// The replicas run as kds-host does by default (zone tokens required, owner holds on, the
// built-in retry policy, the changes relay on), with plaintext KDS on loopback, sharing one token signing key file.
// The zones of 1 and 3 are raw delta xDS clients with zone tokens, in a child process (-fleet),
// those of 4 too (-storm-fleet); the zone of 2 is a real zone control plane (SQLite) in this
// process.
package main

import (
	"bufio"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/examples/bench/internal/benchcp"
	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/store/pgtest"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

func main() {
	writes := flag.Int("writes", 20, "writes through A timed to a zone on B")
	rounds := flag.Int("rounds", 3, "kill -9 rounds")
	zones := flag.Int("zones", 300, "zones per replica in the fan-out")
	fanoutWrites := flag.Int("fanout-writes", 100, "writes timed in each fan-out")
	fanoutRuns := flag.Int("fanout-runs", 3, "runs of the fan-out's configurations (interleaved); the figures are their medians")
	sections := flag.String("sections", "1,2,3", "the sections to run, comma-separated: 1 to 4 (the reconnect storm, 4, runs only when named)")
	var sc stormConfig
	flag.IntVar(&sc.zones, "storm-zones", 1000, "4: zones of the reconnect storm, spread evenly over the three replicas")
	flag.IntVar(&sc.runs, "storm-runs", 1, "4: runs of the storm's configurations (interleaved); each run kills another replica (C, B, A, C...)")
	flag.StringVar(&sc.rateList, "storm-arrival-rate", "0,200", "4: the survivors' --kds-arrival-rate in each configuration, comma-separated (0: no bound)")
	flag.IntVar(&sc.burst, "storm-arrival-burst", 100, "4: the replicas' --kds-arrival-burst")
	flag.DurationVar(&sc.wait, "storm-arrival-wait", engine.DefaultArrivalWait, "4: the replicas' --kds-arrival-wait")
	flag.IntVar(&sc.changes, "storm-changes", 5, "4: resources changed right after the kill in the second variant of each rate (0: no such variant)")
	flag.Float64Var(&sc.writeRate, "storm-write-rate", 5, "4: writes a second through a survivor's API, timed to the zones on the survivors")
	flag.DurationVar(&sc.baseline, "storm-baseline", 10*time.Second, "4: how long the writes are timed before the kill (the baseline without a storm)")
	// Internal: the replica and fleet processes.
	replica := flag.String("replica", "", "internal: run a replica with this id")
	dsn := flag.String("dsn", "", "internal: the replica's store")
	key := flag.String("key", "", "internal: the replica's token signing key file")
	kdsAddr := flag.String("kds-addr", "", "internal: the replica's KDS address")
	relay := flag.Bool("store-relay", true, "internal: the replica shares one LISTEN with the others (GlobalConfig.StoreRelay)")
	procs := flag.Int("replica-procs", 0, "GOMAXPROCS of each replica process (0: Go's default, the machine's cores); 1 stands for a replica on a core of its own, without the Go scheduler's spinning for work against the other processes")
	fleet := flag.String("fleet", "", "internal: be the zones' process; a file of ADDRESS TOKEN NAME lines")
	var arrivals engine.RateLimit
	flag.Float64Var(&arrivals.Rate, "arrival-rate", 0, "internal: the replica's --kds-arrival-rate")
	flag.IntVar(&arrivals.Burst, "arrival-burst", 100, "internal: the replica's --kds-arrival-burst")
	arrivalWait := flag.Duration("arrival-wait", engine.DefaultArrivalWait, "internal: the replica's --kds-arrival-wait")
	stormFleet := flag.String("storm-fleet", "", "internal: be the storm's zones' process; a file of NAME TOKEN ADDRESSES lines")
	victim := flag.String("storm-victim", "", "internal: the KDS address of the replica the storm kills")
	flag.Parse()
	var err error
	switch {
	case *replica != "":
		err = runReplica(*replica, *dsn, *key, *kdsAddr, *relay, arrivals, *arrivalWait)
	case *fleet != "":
		err = runFleet(*fleet)
	case *stormFleet != "":
		err = runStormFleet(*stormFleet, *victim)
	default:
		err = run(options{writes: *writes, rounds: *rounds, zones: *zones, fanoutWrites: *fanoutWrites, fanoutRuns: *fanoutRuns,
			procs: *procs, sections: strings.Split(*sections, ","), storm: sc})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "replicas:", err)
		os.Exit(1)
	}
}

// seed is what the store holds before anything is timed: a Mesh, its defaults and 20 policies.
func seed() []resource.Resource {
	rs := append([]resource.Resource{benchcp.Mesh("default")}, resource.MeshDefaults("default")...)
	for i := range 20 {
		rs = append(rs, benchcp.Timeout("default", fmt.Sprintf("t-%02d", i), time.Second))
	}
	return rs
}

// bench is the parent: the PostgreSQL server, the key, the replicas.
type bench struct {
	tmp      string
	dsn      string
	keyFile  string
	keys     *auth.Keys
	admin    string
	replicas map[string]*replicaProc
	kdsAddrs map[string]string // replica id -> KDS address, kept over restarts
	seq      int
	noRelay  bool // the replicas started now listen each for itself (GlobalConfig.StoreRelay off)
	procs    int  // GOMAXPROCS of the replica processes, 0: the default
	// arrivals and arrivalWait are the --kds-arrival-rate, -burst and -wait of the replicas
	// started now.
	arrivals    engine.RateLimit
	arrivalWait time.Duration
	// noStatements says why PostgreSQL's statements a write are not counted ("": they are,
	// from pg_stat_statements).
	noStatements string
}

// options are the parent's flags.
type options struct {
	writes, rounds, zones, fanoutWrites, fanoutRuns, procs int
	sections                                               []string // "1" to "4"
	storm                                                  stormConfig
}

func run(o options) error {
	if o.writes < 1 || o.rounds < 0 || o.zones < 1 || o.fanoutWrites < 1 || o.fanoutRuns < 1 {
		return fmt.Errorf("-writes, -zones, -fanout-writes and -fanout-runs must be at least 1, -rounds at least 0")
	}
	for _, s := range o.sections {
		if !slices.Contains([]string{"1", "2", "3", "4"}, s) {
			return fmt.Errorf("-sections %s: want sections among 1,2,3,4", strings.Join(o.sections, ","))
		}
	}
	if err := o.storm.parse(); err != nil {
		return err
	}
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "kds-bench-replicas-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	// pg_stat_statements counts the statements a write costs PostgreSQL, beside its CPU.
	srv, err := pgtest.StartServerWith(ctx, "shared_preload_libraries=pg_stat_statements")
	if err != nil {
		return err
	}
	defer srv.Stop()
	dsn, _, err := srv.CreateDatabase(ctx)
	if err != nil {
		return err
	}
	keys, err := auth.LoadKeys(tmp, "", nil) // makes tmp/keys/token-signing.key
	if err != nil {
		return err
	}
	admin, err := keys.Issue(auth.Claims{Kind: auth.KindUser, Name: "admin", Groups: []string{auth.GroupAdmin}}, 0, time.Now())
	if err != nil {
		return err
	}
	b := &bench{tmp: tmp, dsn: dsn, keyFile: filepath.Join(tmp, auth.SigningKeyFile), keys: keys, admin: admin, procs: o.procs,
		replicas: map[string]*replicaProc{}, kdsAddrs: map[string]string{}}
	defer b.stopAll()
	if err := b.withDB(func(ctx context.Context, db *sql.DB) error {
		_, err := db.ExecContext(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
		return err
	}); err != nil {
		b.noStatements = err.Error() // a server of KDS_TEST_POSTGRES_DSN without the module
	}
	st, err := store.Open(ctx, dsn, "")
	if err != nil {
		return err
	}
	err = benchcp.Fill(ctx, st, seed(), 100)
	st.Close()
	if err != nil {
		return err
	}
	for _, id := range []string{"A", "B", "C"} {
		if err := b.start(id); err != nil {
			return err
		}
	}
	gomaxprocs := "Go's default"
	if o.procs > 0 {
		gomaxprocs = strconv.Itoa(o.procs)
	}
	fmt.Printf("PostgreSQL 15, 3 replicas (processes) on one database, %d resources; %d cores; each replica's GOMAXPROCS: %s\n\n", len(seed()), runtime.NumCPU(), gomaxprocs)

	if slices.Contains(o.sections, "1") {
		if err := b.crossReplica(o.writes); err != nil {
			return fmt.Errorf("cross-replica write: %w", err)
		}
	}
	if slices.Contains(o.sections, "2") {
		if err := b.failOver(ctx, o.rounds); err != nil {
			return fmt.Errorf("fail-over: %w", err)
		}
	}
	if slices.Contains(o.sections, "3") {
		if err := b.fanOut(srv.Pid(), o.zones, o.fanoutWrites, o.fanoutRuns); err != nil {
			return fmt.Errorf("fan-out: %w", err)
		}
	}
	if slices.Contains(o.sections, "4") {
		if err := b.storm(srv.Pid(), o.storm); err != nil {
			return fmt.Errorf("reconnect storm: %w", err)
		}
	}
	return nil
}

// crossReplica times writes through A to one zone stream on B.
func (b *bench) crossReplica(writes int) error {
	f, err := b.startFleet(map[string]int{"B": 1}, "ab")
	if err != nil {
		return err
	}
	defer f.close()
	lat, err := b.timeWrites(f, "A", "ab", writes)
	if err != nil {
		return err
	}
	fmt.Printf("1. a write through replica A's API reaching a zone on replica B (%d writes)\n", writes)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "p50\tp90\tmax\t\n%s\t%s\t%s\t\n", benchcp.Ms(pct(lat, 50)), benchcp.Ms(pct(lat, 90)), benchcp.Ms(slices.Max(lat)))
	w.Flush()
	fmt.Println()
	return nil
}

// failOver kills the replica a zone control plane is on, rounds times, with writes meanwhile.
func (b *bench) failOver(ctx context.Context, rounds int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reg := resource.Default()
	zst, err := store.Open(ctx, "", filepath.Join(b.tmp, "zone-fo"))
	if err != nil {
		return err
	}
	defer zst.Close()
	tokenFile := filepath.Join(b.tmp, "zone-fo.token")
	tok, err := b.keys.Issue(auth.Claims{Kind: auth.KindZone, Name: "zone-fo"}, time.Hour, time.Now())
	if err != nil {
		return err
	}
	if err := os.WriteFile(tokenFile, []byte(tok), 0o600); err != nil {
		return err
	}
	var addrs []string
	for _, id := range []string{"B", "C", "A"} {
		addrs = append(addrs, "grpc://"+b.kdsAddrs[id])
	}
	z, err := controlplane.NewZone(controlplane.ZoneConfig{Store: zst, Registry: reg, APIAddr: "127.0.0.1:0", DiagAddr: "127.0.0.1:0",
		Logger: benchcp.Logger("off", "zone"), KDS: zone.Config{Zone: "zone-fo", GlobalAddress: strings.Join(addrs, ","), TokenFile: tokenFile}})
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- z.Run(ctx) }()
	defer func() { cancel(); <-done }()
	holds := func(want map[string]string) bool {
		for name, d := range want {
			r, err := zst.Get(ctx, resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: name})
			if err != nil || !strings.Contains(string(r.Spec), `"`+d+`"`) {
				return false
			}
		}
		return true
	}
	if err := waitFor(30*time.Second, "the zone to sync", func() bool { return holds(map[string]string{"t-19": "1s"}) }); err != nil {
		return err
	}
	fmt.Printf("2. kill -9 of the replica a zone control plane is on, 5 writes meanwhile (3 changed, 2 new), %d rounds\n", rounds)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "round\tfrom\tto\tconnected after\tholds the writes after\tresent\tchanged\t\n")
	for round := 1; round <= rounds; round++ {
		from := b.replicaAt(z.Client.Stats().Global)
		before := map[string]int64{}
		for id := range b.replicas {
			if before[id], err = b.sent(id, "zone-fo"); err != nil {
				return err
			}
		}
		writer := "A"
		if from == "A" {
			writer = "C"
		}
		t0 := time.Now()
		b.replicas[from].kill()
		delete(b.replicas, from)
		want := map[string]string{}
		for i := range 3 {
			d := fmt.Sprintf("%ds", 10*round+i)
			want[fmt.Sprintf("t-%02d", i)] = d
			if err := b.put(writer, fmt.Sprintf("t-%02d", i), d); err != nil {
				return err
			}
		}
		for i := range 2 {
			name := fmt.Sprintf("fo-%d-%d", round, i)
			want[name] = "1s"
			if err := b.put(writer, name, "1s"); err != nil {
				return err
			}
		}
		var moved time.Duration
		if err := waitFor(30*time.Second, "the zone to move", func() bool {
			s := z.Client.Stats()
			if s.Connected && b.replicaAt(s.Global) != from {
				moved = time.Since(t0)
				return true
			}
			return false
		}); err != nil {
			return err
		}
		if err := waitFor(30*time.Second, "the zone to hold the writes", func() bool { return holds(want) }); err != nil {
			return err
		}
		all := time.Since(t0)
		to := b.replicaAt(z.Client.Stats().Global)
		time.Sleep(300 * time.Millisecond) // the counters settle; anything more would show
		after, err := b.sent(to, "zone-fo")
		if err != nil {
			return err
		}
		resent := after - before[to]
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t\n", round, from, to, benchcp.Ms(moved), benchcp.Ms(all), resent, len(want))
		if resent != int64(len(want)) {
			w.Flush()
			return fmt.Errorf("round %d: replica %s sent the zone %d resources, %d changed", round, to, resent, len(want))
		}
		if err := b.start(from); err != nil { // back, on the same address, for the next round
			return err
		}
	}
	w.Flush()
	fmt.Println()
	return nil
}

// from before the PUT until every stream of the fleet had ACKed it.
func (b *bench) timeWrites(f *fleetProc, via, prefix string, writes int) ([]time.Duration, error) {
	var lat []time.Duration
	for i := range writes {
		name := fmt.Sprintf("%s-%02d", prefix, i)
		t0 := time.Now()
		if err := b.put(via, name, "1s"); err != nil {
			return nil, err
		}
		at, err := f.wait(name, 30*time.Second)
		if err != nil {
			return nil, err
		}
		lat = append(lat, at.Sub(t0))
		time.Sleep(50 * time.Millisecond)
	}
	return lat, nil
}

func (b *bench) put(via, name, d string) error { return b.putTo(b.replicas[via], name, d) }

// putTo puts a MeshTimeout name of connection timeout d through replica p's API.
func (b *bench) putTo(p *replicaProc, name, d string) error {
	c := &api.Client{BaseURL: "http://" + p.api, HTTPClient: &http.Client{Timeout: 10 * time.Second}, Token: b.admin}
	mt, _ := resource.Default().Get("MeshTimeout")
	r := benchcp.Timeout("default", name, mustDuration(d))
	doc, err := json.Marshal(map[string]any{"type": "MeshTimeout", "mesh": "default", "name": name, "spec": r.Spec})
	if err != nil {
		return err
	}
	if _, _, err := c.Put(context.Background(), mt, "default", name, doc); err != nil {
		return fmt.Errorf("put %s through %s: %w", name, p.api, err)
	}
	return nil
}

func mustDuration(s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return d
}

// sent sums kds_resources_sent_total of zone on a replica.
func (b *bench) sent(id, zoneName string) (int64, error) {
	p := b.replicas[id]
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + p.diag + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var n int64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "kds_resources_sent_total{") && strings.Contains(line, `zone="`+zoneName+`"`) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			n += int64(v)
		}
	}
	return n, sc.Err()
}

// replicaAt is the id of the replica at a zone's Stats.Global address.
func (b *bench) replicaAt(addr string) string {
	for id, a := range b.kdsAddrs {
		if addr == "grpc://"+a {
			return id
		}
	}
	return "?"
}

// replicaProc is a replica's process.
type replicaProc struct {
	cmd            *exec.Cmd
	stdin          io.WriteCloser
	kds, api, diag string
}

func (b *bench) start(id string) error {
	addr := b.kdsAddrs[id]
	if addr == "" {
		port, err := freePort()
		if err != nil {
			return err
		}
		addr = fmt.Sprintf("127.0.0.1:%d", port)
		b.kdsAddrs[id] = addr
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "-replica", id, "-dsn", b.dsn, "-key", b.keyFile, "-kds-addr", addr, fmt.Sprintf("-store-relay=%t", !b.noRelay),
		fmt.Sprintf("-arrival-rate=%g", b.arrivals.Rate), fmt.Sprintf("-arrival-burst=%d", max(b.arrivals.Burst, 1)), "-arrival-wait="+cmp.Or(b.arrivalWait, engine.DefaultArrivalWait).String())
	cmd.Stderr = os.Stderr
	if b.procs > 0 {
		cmd.Env = append(os.Environ(), fmt.Sprintf("GOMAXPROCS=%d", b.procs))
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) != 4 || f[0] != "ready" {
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("replica %s did not start: %q %v", id, line, err)
	}
	b.replicas[id] = &replicaProc{cmd: cmd, stdin: stdin, kds: f[1], api: f[2], diag: f[3]}
	return nil
}

// close stops a replica gracefully.
func (p *replicaProc) close() {
	p.stdin.Close()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		p.kill()
	}
}

func (p *replicaProc) kill() {
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

func (b *bench) stopAll() {
	for id, p := range b.replicas {
		p.close()
		delete(b.replicas, id)
	}
}

// runReplica is a replica's process: it prints "ready KDS API DIAG" and runs until its
// standard input closes.
func runReplica(id, dsn, keyFile, kdsAddr string, relay bool, arrivals engine.RateLimit, arrivalWait time.Duration) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := store.Open(ctx, dsn, "")
	if err != nil {
		return err
	}
	defer st.Close()
	keys, err := auth.LoadKeys("", keyFile, nil)
	if err != nil {
		return err
	}
	gl, err := benchcp.StartGlobal(ctx, controlplane.GlobalConfig{Store: st, Registry: resource.Default(), Builtin: retrypolicy.New(),
		OwnerHolds: true, Keys: keys, KDSAuth: true, KDSAddr: kdsAddr, ReplicaID: id, StoreRelay: relay,
		Arrivals: arrivals, ArrivalWait: arrivalWait, Logger: benchcp.Logger(os.Getenv("KDS_BENCH_LOG"), "replica-"+id)})
	if err != nil {
		return err
	}
	fmt.Printf("ready %s %s %s\n", gl.KDSAddr(), gl.APIAddr(), gl.DiagAddr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return gl.Stop()
}

func waitFor(timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

func pct[T cmp.Ordered](ds []T, p int) T {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

// freePort is a loopback port that was free a moment ago.
func freePort() (int, error) {
	low := 32768 // Linux's default start of the ephemeral range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			low, _ = strconv.Atoi(f[0])
		}
	}
	if low > 12000 {
		// Below the ephemeral range: no outgoing connection (the fleet's, PostgreSQL's clients')
		// takes the port while a replica that keeps it across its restarts is down.
		for range 100 {
			if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 10000+rand.IntN(low-10000))); err == nil {
				defer l.Close()
				return l.Addr().(*net.TCPAddr).Port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
