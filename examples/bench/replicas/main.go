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
//     go run ./examples/bench/replicas [-writes 20] [-rounds 3] [-zones 300] [-fanout-writes 100] [-fanout-runs 3] [-replica-procs N]
//
// The replicas run as kds-host does by default (zone tokens required, owner holds on, the
// built-in retry policy, the changes relay on), with plaintext KDS on loopback, sharing one token signing key file.
// The zones of 1 and 3 are raw delta xDS clients with zone tokens, in a child process (-fleet);
// the zone of 2 is a real zone control plane (SQLite) in this process.
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
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

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
	// Internal: the replica and fleet processes.
	replica := flag.String("replica", "", "internal: run a replica with this id")
	dsn := flag.String("dsn", "", "internal: the replica's store")
	key := flag.String("key", "", "internal: the replica's token signing key file")
	kdsAddr := flag.String("kds-addr", "", "internal: the replica's KDS address")
	relay := flag.Bool("store-relay", true, "internal: the replica shares one LISTEN with the others (GlobalConfig.StoreRelay)")
	procs := flag.Int("replica-procs", 0, "GOMAXPROCS of each replica process (0: Go's default, the machine's cores); 1 stands for a replica on a core of its own, without the Go scheduler's spinning for work against the other processes")
	fleet := flag.String("fleet", "", "internal: be the zones' process; a file of ADDRESS TOKEN NAME lines")
	flag.Parse()
	var err error
	switch {
	case *replica != "":
		err = runReplica(*replica, *dsn, *key, *kdsAddr, *relay)
	case *fleet != "":
		err = runFleet(*fleet)
	default:
		err = run(*writes, *rounds, *zones, *fanoutWrites, *fanoutRuns, *procs)
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
	// noStatements says why PostgreSQL's statements a write are not counted ("": they are,
	// from pg_stat_statements).
	noStatements string
}

func run(writes, rounds, zones, fanoutWrites, fanoutRuns, procs int) error {
	if writes < 1 || rounds < 0 || zones < 1 || fanoutWrites < 1 || fanoutRuns < 1 {
		return fmt.Errorf("-writes, -zones, -fanout-writes and -fanout-runs must be at least 1, -rounds at least 0")
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
	b := &bench{tmp: tmp, dsn: dsn, keyFile: filepath.Join(tmp, auth.SigningKeyFile), keys: keys, admin: admin, procs: procs,
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
	if procs > 0 {
		gomaxprocs = strconv.Itoa(procs)
	}
	fmt.Printf("PostgreSQL 15, 3 replicas (processes) on one database, %d resources; %d cores; each replica's GOMAXPROCS: %s\n\n", len(seed()), runtime.NumCPU(), gomaxprocs)

	if err := b.crossReplica(writes); err != nil {
		return fmt.Errorf("cross-replica write: %w", err)
	}
	if err := b.failOver(ctx, rounds); err != nil {
		return fmt.Errorf("fail-over: %w", err)
	}
	if err := b.fanOut(srv.Pid(), zones, fanoutWrites, fanoutRuns); err != nil {
		return fmt.Errorf("fan-out: %w", err)
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

// fanOutCase is one fan-out configuration: the replicas up and the zones on each, and whether
// they listen each for itself (the changes relay off).
type fanOutCase struct {
	up      []string
	on      map[string]int
	noRelay bool
}

// fanOutFigures is one configuration's run: latencies, and CPU per write of each replica, of the
// zones' process and of PostgreSQL (the postmaster and its backends), each net of what the
// process used over as long a window with no write.
type fanOutFigures struct {
	lat      []time.Duration
	replica  map[string]time.Duration
	zones    time.Duration
	postgres time.Duration // net of the same window idle
	// postgresRaw is PostgreSQL's CPU over the writes' window, per write, idle work included.
	postgresRaw time.Duration
	// listen is the part of postgres that the replicas' LISTEN backends used (each delivers
	// every write's notification to its replica), net of idle.
	listen time.Duration
	// clients is the part that the other client backends used (the replicas' pools, the
	// writes' own connections), net of idle; the rest of postgres is its background processes
	// (WAL writer, checkpointer, autovacuum...) and backends that exited meanwhile.
	clients time.Duration
	// statements and rows are what PostgreSQL executed a write (pg_stat_statements: calls and
	// rows of every statement but the bench's own), net of idle; 0 when not counted.
	statements, rows float64
}

// fanOut times a write through A to every stream of zones zones on A alone, then with the
// streams on other replicas too, runs times (interleaved), and prints each configuration's
// medians and the issue's ratios. CPU is what each process used over the timed writes, less what
// it used over as long a window right after with no write, per write (from /proc, 10 ms ticks): with every process on one machine, the machine's cores bound
// the wall-clock fan-out of three replicas, so CPU is the figure that says whether replicas
// scale out.
func (b *bench) fanOut(pg int, zones, writes, runs int) error {
	cases := []fanOutCase{
		{[]string{"A"}, map[string]int{"A": zones}, false},
		{[]string{"A", "B", "C"}, map[string]int{"A": zones}, false},
		{[]string{"A", "B", "C"}, map[string]int{"B": zones}, false},
		{[]string{"A", "B", "C"}, map[string]int{"A": zones, "B": zones, "C": zones}, false},
		// The same without the changes relay: every replica LISTENs.
		{[]string{"A", "B", "C"}, map[string]int{"A": zones, "B": zones, "C": zones}, true},
	}
	figs := make([][]fanOutFigures, len(cases))
	for run := range runs {
		for i, c := range cases {
			f, err := b.fanOutOnce(pg, c, writes)
			if err != nil {
				return fmt.Errorf("run %d, replicas %s, zones on %s: %w", run+1, strings.Join(c.up, ","), strings.Join(slices.Sorted(maps.Keys(c.on)), ","), err)
			}
			figs[i] = append(figs[i], f)
		}
	}
	fmt.Printf("3. fan-out: a write through A reaching every zone stream (%d writes each, medians of %d runs)\n", writes, runs)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "replicas up\trelay\tzones on\tstreams\tp50\tp90\tmax\tCPU per write, net of idle: A\tB\tC\tzones\tPostgreSQL\tof it LISTEN backends\tother client backends\tthe rest\tPostgreSQL with idle\tstatements a write\trows\t\n")
	med := func(i int, of func(fanOutFigures) time.Duration) time.Duration { return medianOf(figs[i], of) }
	for i, c := range cases {
		streams := 0
		for _, n := range c.on {
			streams += n
		}
		relay := "on"
		if c.noRelay {
			relay = "off"
		}
		cells := []string{strings.Join(c.up, ","), relay, strings.Join(slices.Sorted(maps.Keys(c.on)), ","), strconv.Itoa(streams),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return pct(f.lat, 50) })),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return pct(f.lat, 90) })),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return slices.Max(f.lat) }))}
		for _, id := range []string{"A", "B", "C"} {
			if slices.Contains(c.up, id) {
				cells = append(cells, benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return f.replica[id] })))
			} else {
				cells = append(cells, "-")
			}
		}
		cells = append(cells, benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return f.zones })),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return f.postgres })),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return f.listen })),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return f.clients })),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return f.postgres - f.listen - f.clients })),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return f.postgresRaw })))
		if b.noStatements != "" {
			cells = append(cells, "-", "-")
		} else {
			cells = append(cells, fmt.Sprintf("%.1f", medianOf(figs[i], func(f fanOutFigures) float64 { return f.statements })),
				fmt.Sprintf("%.1f", medianOf(figs[i], func(f fanOutFigures) float64 { return f.rows })))
		}
		fmt.Fprintln(w, strings.Join(cells, "\t")+"\t")
	}
	w.Flush()
	one, three, threeAlone := 0, len(cases)-2, len(cases)-1
	base := med(one, func(f fanOutFigures) time.Duration { return f.replica["A"] })
	worst, worstID := time.Duration(0), ""
	for _, id := range []string{"A", "B", "C"} {
		if d := med(three, func(f fanOutFigures) time.Duration { return f.replica[id] }); d >= worst {
			worst, worstID = d, id
		}
	}
	ratio := func(a, b time.Duration) float64 {
		if b <= 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	p1 := med(three, func(f fanOutFigures) time.Duration { return pct(f.lat, 50) })
	p0 := med(one, func(f fanOutFigures) time.Duration { return pct(f.lat, 50) })
	pgAll := func(i int) time.Duration { return med(i, func(f fanOutFigures) time.Duration { return f.postgres }) }
	pgListen := func(i int) time.Duration { return med(i, func(f fanOutFigures) time.Duration { return f.listen }) }
	fmt.Printf("3 x %d vs 1 x %d: the busiest replica's CPU per write (%s) %.2fx the single replica's (limit 1.15); PostgreSQL's CPU per write %.2fx (limit: the same; %.2fx with its idle work over the longer window; %.2fx but for its LISTEN backends);\n",
		zones, zones, worstID, ratio(worst, base),
		ratio(pgAll(three), pgAll(one)),
		ratio(med(three, func(f fanOutFigures) time.Duration { return f.postgresRaw }), med(one, func(f fanOutFigures) time.Duration { return f.postgresRaw })),
		ratio(pgAll(three)-pgListen(three), pgAll(one)-pgListen(one)))
	pgClients := func(i int) time.Duration { return med(i, func(f fanOutFigures) time.Duration { return f.clients }) }
	pgRest := func(i int) time.Duration {
		return med(i, func(f fanOutFigures) time.Duration { return f.postgres - f.listen - f.clients })
	}
	// The LISTEN backends' share is a few 10 ms clock ticks over the writes: in ms, not a ratio.
	fmt.Printf("  of PostgreSQL's: LISTEN backends %s against %s a write, other client backends %.2fx, the rest (background processes, backends gone) %s against %s\n",
		benchcp.Ms(pgListen(three)), benchcp.Ms(pgListen(one)), ratio(pgClients(three), pgClients(one)), benchcp.Ms(pgRest(three)), benchcp.Ms(pgRest(one)))
	fmt.Printf("  without the changes relay (every replica LISTENs): PostgreSQL's CPU per write %.2fx (LISTEN backends %s a write); the busiest replica %.2fx\n",
		ratio(pgAll(threeAlone), pgAll(one)), benchcp.Ms(pgListen(threeAlone)),
		ratio(max(med(threeAlone, func(f fanOutFigures) time.Duration { return f.replica["A"] }),
			med(threeAlone, func(f fanOutFigures) time.Duration { return f.replica["B"] }),
			med(threeAlone, func(f fanOutFigures) time.Duration { return f.replica["C"] })), base))
	fmt.Printf("  A with three replicas up and only its own zones' streams (the others idle): %.2fx the single replica's\n",
		ratio(med(1, func(f fanOutFigures) time.Duration { return f.replica["A"] }), base))
	fmt.Printf("  wall clock p50 %.2fx, with every process on the same %d cores\n", ratio(p1, p0), runtime.NumCPU())
	if b.noStatements != "" {
		fmt.Printf("  PostgreSQL's statements a write: not counted (pg_stat_statements: %s)\n", b.noStatements)
	} else {
		fmt.Printf("  PostgreSQL's statements a write (pg_stat_statements, net of idle): %.1f with one replica, %.1f with three (rows %.1f and %.1f)\n",
			medianOf(figs[one], func(f fanOutFigures) float64 { return f.statements }), medianOf(figs[three], func(f fanOutFigures) float64 { return f.statements }),
			medianOf(figs[one], func(f fanOutFigures) float64 { return f.rows }), medianOf(figs[three], func(f fanOutFigures) float64 { return f.rows }))
	}
	return nil
}

// medianOf is the median of of over figs (pct's, the lower of two middles).
func medianOf[T cmp.Ordered](figs []fanOutFigures, of func(fanOutFigures) T) T {
	vs := make([]T, 0, len(figs))
	for _, f := range figs {
		vs = append(vs, of(f))
	}
	return pct(vs, 50)
}

// statementCount is pg_stat_statements' calls and rows so far, of every statement but the bench's
// own (its pg_stat_* queries); zero when statements are not counted.
type statementCount struct{ calls, rows int64 }

func (b *bench) statements() (statementCount, error) {
	var c statementCount
	if b.noStatements != "" {
		return c, nil
	}
	err := b.withDB(func(ctx context.Context, db *sql.DB) error {
		return db.QueryRowContext(ctx, `SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(rows), 0)::bigint
			FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_backend_pid%'`).Scan(&c.calls, &c.rows)
	})
	if err != nil {
		return c, fmt.Errorf("count PostgreSQL's statements: %w", err)
	}
	return c, nil
}

// fanOutOnce brings up c's replicas, starts its zones, and times writes through A.
func (b *bench) fanOutOnce(pg int, c fanOutCase, writes int) (fanOutFigures, error) {
	var fig fanOutFigures
	if c.noRelay != b.noRelay {
		// Every replica again, in the other mode; A first, as run starts it.
		b.stopAll()
		b.noRelay = c.noRelay
		if err := b.start("A"); err != nil {
			return fig, err
		}
	}
	for _, id := range []string{"B", "C"} {
		_, up := b.replicas[id]
		switch want := slices.Contains(c.up, id); {
		case up && !want:
			b.replicas[id].close()
			delete(b.replicas, id)
		case !up && want:
			if err := b.start(id); err != nil {
				return fig, err
			}
		}
	}
	b.seq++
	prefix := fmt.Sprintf("fan%d", b.seq)
	f, err := b.startFleet(c.on, prefix)
	if err != nil {
		return fig, err
	}
	defer f.close()
	time.Sleep(500 * time.Millisecond) // the streams' first pushes are over
	pids := map[string]int{}
	cpu0 := map[string]time.Duration{}
	for id, p := range b.replicas {
		pids[id] = p.cmd.Process.Pid
		cpu0[id] = cpuTime([]int{pids[id]})
	}
	fleet := []int{f.Cmd.Process.Pid}
	listeners, err := b.listenBackends()
	if err != nil {
		return fig, err
	}
	clients0, err := b.clientBackends(nil)
	if err != nil {
		return fig, err
	}
	st0, err := b.statements()
	if err != nil {
		return fig, err
	}
	fcpu0, pcpu0, lcpu0 := cpuTime(fleet), treeCPU(pg), cpuTime(listeners)
	start := time.Now()
	if fig.lat, err = b.timeWrites(f, "A", prefix, writes); err != nil {
		return fig, err
	}
	window := time.Since(start)
	used := map[string]time.Duration{}
	for id, pid := range pids {
		used[id] = cpuTime([]int{pid}) - cpu0[id]
	}
	fused, pused, lused := cpuTime(fleet)-fcpu0, treeCPU(pg)-pcpu0, cpuTime(listeners)-lcpu0
	st1, err := b.statements()
	if err != nil {
		return fig, err
	}
	clients1, err := b.clientBackends(clients0)
	if err != nil {
		return fig, err
	}

	// The same configuration idle for as long: what the processes use with no write (the
	// replicas' heartbeats, PostgreSQL's own background work) grows with the window, and three
	// replicas' fan-out on two cores takes a longer window than one's. Net of it, a figure is
	// what the writes cost.
	idle0 := map[string]time.Duration{}
	for id, pid := range pids {
		idle0[id] = cpuTime([]int{pid})
	}
	fidle0, pidle0, lidle0 := cpuTime(fleet), treeCPU(pg), cpuTime(listeners)
	st1idle, err := b.statements()
	if err != nil {
		return fig, err
	}
	time.Sleep(window)
	st2, err := b.statements()
	if err != nil {
		return fig, err
	}
	clients2, err := b.clientBackends(clients1)
	if err != nil {
		return fig, err
	}
	fig.statements = float64((st1.calls-st0.calls)-(st2.calls-st1idle.calls)) / float64(writes)
	fig.rows = float64((st1.rows-st0.rows)-(st2.rows-st1idle.rows)) / float64(writes)
	per := func(d time.Duration) time.Duration { return max(0, d) / time.Duration(writes) }
	fig.replica = map[string]time.Duration{}
	for id, pid := range pids {
		fig.replica[id] = per(used[id] - (cpuTime([]int{pid}) - idle0[id]))
	}
	fig.zones = per(fused - (cpuTime(fleet) - fidle0))
	pidle := treeCPU(pg) - pidle0
	fig.postgres, fig.postgresRaw = per(pused-pidle), per(pused)
	fig.listen = per(lused - (cpuTime(listeners) - lidle0))
	fig.clients = per(clients1.used(clients0) - clients2.used(clients1))
	return fig, nil
}

// backendCPU is the CPU each client backend used so far, by pid.
type backendCPU map[int]time.Duration

// used is the CPU the backends used since before: a backend that was not there started at 0
// (one that exited meanwhile is not counted: its CPU is in the postmaster's children's).
func (now backendCPU) used(before backendCPU) time.Duration {
	var d time.Duration
	for pid, t := range now {
		d += t - before[pid]
	}
	return d
}

// clientBackends is the CPU of PostgreSQL's client backends other than the LISTEN ones and the
// bench's own (the replicas' pools, the writes' connections): those listed now, and those of
// known that are still there.
func (b *bench) clientBackends(known backendCPU) (backendCPU, error) {
	pids, err := b.backends("client backends", `SELECT pid FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND application_name <> $1 AND pid <> pg_backend_pid()`, store.ListenApplicationName)
	if err != nil {
		return nil, err
	}
	for pid := range known {
		if !slices.Contains(pids, pid) {
			pids = append(pids, pid)
		}
	}
	out := backendCPU{}
	for _, pid := range pids {
		if statFields(pid) != nil {
			out[pid] = cpuTime([]int{pid})
		}
	}
	return out, nil
}

// listenBackends are the PostgreSQL backends of the replicas' LISTEN connections
// (store.ListenApplicationName in pg_stat_activity).
func (b *bench) listenBackends() ([]int, error) {
	return b.backends("LISTEN backends", "SELECT pid FROM pg_stat_activity WHERE application_name = $1", store.ListenApplicationName)
}

// backends are the pids a query of pg_stat_activity lists (what names them, for its error).
func (b *bench) backends(what, query string, args ...any) ([]int, error) {
	var pids []int
	err := b.withDB(func(ctx context.Context, db *sql.DB) error {
		rows, err := db.QueryContext(ctx, query, args...)
		if err != nil {
			return fmt.Errorf("list the %s: %w", what, err)
		}
		defer rows.Close()
		for rows.Next() {
			var pid int
			if err := rows.Scan(&pid); err != nil {
				return err
			}
			pids = append(pids, pid)
		}
		return rows.Err()
	})
	return pids, err
}

// withDB runs f with a connection pool to the bench's database, closed after it, and ten
// seconds for the queries f makes.
func (b *bench) withDB(f func(context.Context, *sql.DB) error) error {
	db, err := sql.Open("pgx", b.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return f(ctx, db)
}

// cpuTime is the user and system time the processes used so far (/proc/PID/stat).
func cpuTime(pids []int) time.Duration {
	var ticks int64
	for _, pid := range pids {
		f := statFields(pid)
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// treeCPU is the CPU a PostgreSQL server used so far: the postmaster's own, its children's
// that have exited (cutime, cstime) and its live children's (the backends, the writer, the
// checkpointer...).
func treeCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	var ticks int64
	if f := statFields(pid); len(f) >= 15 {
		for _, i := range []int{11, 12, 13, 14} {
			v, _ := strconv.ParseInt(f[i], 10, 64)
			ticks += v
		}
	}
	d := time.Duration(ticks) * 10 * time.Millisecond
	entries, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := statFields(child); len(f) >= 2 && f[1] == strconv.Itoa(pid) {
			kids = append(kids, child)
		}
	}
	return d + cpuTime(kids)
}

// statFields are /proc/PID/stat's fields after the command name (which is in parentheses and
// may hold spaces): [0] is the state, [1] the parent's pid, [11] utime, [12] stime, [13]
// cutime, [14] cstime. Nil when the process is gone.
func statFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return strings.Fields(rest)
}

// timeWrites puts writes new MeshTimeouts through replica via and returns, for each, the time
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

func (b *bench) put(via, name, d string) error {
	p := b.replicas[via]
	c := &api.Client{BaseURL: "http://" + p.api, HTTPClient: &http.Client{Timeout: 10 * time.Second}, Token: b.admin}
	mt, _ := resource.Default().Get("MeshTimeout")
	r := benchcp.Timeout("default", name, mustDuration(d))
	doc, err := json.Marshal(map[string]any{"type": "MeshTimeout", "mesh": "default", "name": name, "spec": r.Spec})
	if err != nil {
		return err
	}
	if _, _, err := c.Put(context.Background(), mt, "default", name, doc); err != nil {
		return fmt.Errorf("put %s through %s: %w", name, via, err)
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
	cmd := exec.Command(self, "-replica", id, "-dsn", b.dsn, "-key", b.keyFile, "-kds-addr", addr, fmt.Sprintf("-store-relay=%t", !b.noRelay))
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
func runReplica(id, dsn, keyFile, kdsAddr string, relay bool) error {
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
		OwnerHolds: true, Keys: keys, KDSAuth: true, KDSAddr: kdsAddr, ReplicaID: id, StoreRelay: relay, Logger: benchcp.Logger(os.Getenv("KDS_BENCH_LOG"), "replica-"+id)})
	if err != nil {
		return err
	}
	fmt.Printf("ready %s %s %s\n", gl.KDSAddr(), gl.APIAddr(), gl.DiagAddr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return gl.Stop()
}

// fleetProc is the zones' process. It prints "synced" once every stream holds the seed, then
// "got NAME UNIXNANO" when every stream holds a resource named NAME.
type fleetProc struct {
	*benchcp.Fleet
	mu   sync.Mutex
	got  map[string]time.Time
	cond chan struct{} // closed and replaced at every line
	err  error
}

func (b *bench) startFleet(perReplica map[string]int, prefix string) (*fleetProc, error) {
	var lines []string
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range perReplica {
			if !yield(id) {
				return
			}
		}
	}) {
		for i := range perReplica[id] {
			name := fmt.Sprintf("%s-%s-%04d", prefix, strings.ToLower(id), i)
			tok, err := b.keys.Issue(auth.Claims{Kind: auth.KindZone, Name: name}, time.Hour, time.Now())
			if err != nil {
				return nil, err
			}
			lines = append(lines, b.replicas[id].kds+" "+tok+" "+name)
		}
	}
	b.seq++
	file := filepath.Join(b.tmp, fmt.Sprintf("fleet-%d", b.seq))
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		return nil, err
	}
	fl, err := benchcp.StartFleet("-fleet", file)
	if err != nil {
		return nil, err
	}
	f := &fleetProc{Fleet: fl, got: map[string]time.Time{}, cond: make(chan struct{})}
	go func() {
		for {
			line, err := fl.Out.ReadString('\n')
			f.mu.Lock()
			if err != nil {
				f.err = fmt.Errorf("the zones' process: %w", err)
			} else if fs := strings.Fields(line); len(fs) == 3 && fs[0] == "got" {
				ns, _ := strconv.ParseInt(fs[2], 10, 64)
				f.got[fs[1]] = time.Unix(0, ns)
			}
			close(f.cond)
			f.cond = make(chan struct{})
			f.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return f, nil
}

// wait returns when every stream has ACKed the resource named name.
func (f *fleetProc) wait(name string, timeout time.Duration) (time.Time, error) {
	deadline := time.After(timeout)
	for {
		f.mu.Lock()
		at, ok := f.got[name]
		cond, err := f.cond, f.err
		f.mu.Unlock()
		switch {
		case ok:
			return at, nil
		case err != nil:
			return time.Time{}, err
		}
		select {
		case <-cond:
		case <-deadline:
			return time.Time{}, fmt.Errorf("not every stream got %s within %s", name, timeout)
		}
	}
}

func (f *fleetProc) close() { f.Close() }

// perConn is how many zone streams share one connection (a global allows 16).
const perConn = 8

// runFleet is the zones' process: one raw delta xDS stream per line of file, every kind
// subscribed, everything ACKed.
func runFleet(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	type zoneLine struct{ addr, token, name string }
	var zs []zoneLine
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 {
			zs = append(zs, zoneLine{f[0], f[1], f[2]})
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	want := len(seed())
	var mu sync.Mutex
	acked := map[string]int{} // resource name -> streams that ACKed it
	synced := 0
	out := bufio.NewWriter(os.Stdout)
	errs := make(chan error, len(zs))
	var wg sync.WaitGroup
	conns := map[string]*grpc.ClientConn{}
	count := map[string]int{}
	kinds := resource.Default().Names()
	for _, z := range zs {
		if count[z.addr]%perConn == 0 {
			c, err := grpc.NewClient(z.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return err
			}
			defer c.Close()
			conns[z.addr] = c
		}
		count[z.addr]++
		cc := conns[z.addr]
		wg.Go(func() {
			sctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+z.token)
			s, err := discovery.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(sctx)
			if err != nil {
				errs <- err
				return
			}
			node := &core.Node{Id: z.name}
			for _, k := range kinds {
				if err := s.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: k}); err != nil {
					errs <- err
					return
				}
				node = nil
			}
			n := 0
			for {
				resp, err := s.Recv()
				if err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("%s: %w", z.name, err)
					}
					return
				}
				now := time.Now()
				mu.Lock()
				before := n
				n += len(resp.GetResources())
				if before < want && n >= want {
					if synced++; synced == len(zs) {
						fmt.Fprintln(out, "synced")
						out.Flush()
					}
				}
				if before >= want {
					for _, r := range resp.GetResources() {
						_, name, _ := strings.Cut(r.GetName(), "/")
						if acked[name]++; acked[name] == len(zs) {
							fmt.Fprintf(out, "got %s %d\n", name, now.UnixNano())
							out.Flush()
						}
					}
				}
				mu.Unlock()
				if s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}) != nil {
					return
				}
			}
		})
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	select {
	case err := <-errs:
		cancel()
		wg.Wait()
		return err
	case <-ctx.Done():
	}
	wg.Wait()
	return nil
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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
