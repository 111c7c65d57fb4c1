// Command guardfleet measures the guard package at fleet scale as an outside client sees it:
// examples/xds-server serving a resources file (100 clusters, examples/xds-server's file contract)
// to N xDS streams, for each cache (snapshot, linear, mux) three servers in rotation within the
// same run:
//
//   - stock: a minimal go-control-plane v0.14 server over that cache with the same file
//     contract (this program, -stock; stock.go);
//   - guard-off: examples/xds-server --guard=false --cache CACHE (go-control-plane's stock server
//     behind the example's file reading, limits and metrics);
//   - guard-on: examples/xds-server --cache CACHE (guard.New over the cache).
//
// The fleet is another process (this program, -fleet): N streams over N/10 connections, dialed
// with grpc-go's defaults (-fixed-windows: fixed windows, as Envoy and kds-host's zones have),
// CDS wildcard, SotW or delta; -lean has its SotW streams read responses without unmarshalling
// their resources. It reports when every stream holds every cluster, and for each
// update when the first and the last stream got it. Each update changes one cluster, written to
// the file and renamed into place; each server says on /metrics when it gave that content to its
// cache (kds_xds_resources_file_loaded_timestamp_seconds), and the latencies count from there and
// from the rename (one machine, one clock).
//
//	go run ./examples/bench/guardfleet -scenarios sotw:1000 -runs 1            # a few minutes
//	go run ./examples/bench/guardfleet -scenarios sotw:1000,sotw:10000,delta:10000 -runs 3   # the issue's
//
// See docs/benchmarks.md for what each column means.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kds-host/kds-host/examples/bench/internal/procstat"
)

// The caches a server serves from (examples/xds-server's --cache values).
const (
	cacheSnapshot = "snapshot"
	cacheLinear   = "linear"
	cacheMux      = "mux"
)

// The servers measured over each cache.
const (
	stock    = "stock"
	guardOff = "guard-off"
	guardOn  = "guard-on"
)

var (
	allCaches  = []string{cacheSnapshot, cacheLinear, cacheMux}
	allServers = []string{stock, guardOff, guardOn}
)

// scenario is Streams streams of one protocol.
type scenario struct {
	Delta   bool `json:"delta"`
	Streams int  `json:"streams"`
}

func (s scenario) String() string {
	if s.Delta {
		return fmt.Sprintf("delta:%d", s.Streams)
	}
	return fmt.Sprintf("sotw:%d", s.Streams)
}

type options struct {
	scenarios      []scenario
	caches         []string
	runs           int
	clusters       int
	updates        int
	warmup         int
	idle           time.Duration
	streamsPerConn int
	fixedWindows   bool
	lean           bool
	pin            bool
	out            string
	bin            string
	syncTimeout    time.Duration
	updateTimeout  time.Duration
	command        string
}

func main() {
	var o options
	scen := flag.String("scenarios", "sotw:1000,sotw:10000,delta:10000", "PROTOCOL:STREAMS,... (PROTOCOL sotw or delta)")
	caches := flag.String("caches", strings.Join(allCaches, ","), "caches, each with the three servers: snapshot, linear, mux")
	flag.IntVar(&o.runs, "runs", 1, "runs of everything, interleaved; the figures are the runs' medians")
	flag.IntVar(&o.clusters, "clusters", 100, "clusters in the resources file")
	flag.IntVar(&o.updates, "updates", 10, "measured updates per server run (one cluster changed each)")
	flag.IntVar(&o.warmup, "warmup", 2, "unmeasured updates before them")
	flag.DurationVar(&o.idle, "idle", 5*time.Second, "how long the idle server CPU is measured, every stream open")
	flag.IntVar(&o.streamsPerConn, "streams-per-conn", 10, "streams per gRPC connection (N/10 connections by default)")
	flag.BoolVar(&o.pin, "pin", false, "the server on core 0 and the fleet on core 1 (taskset; each then runs with GOMAXPROCS 1), as a server and its clients are on machines of their own, instead of sharing every core")
	flag.BoolVar(&o.lean, "lean", false, "the fleet's SotW streams read each response's version, nonce and type URL from the wire and scan its resources' bytes, "+
		"without unmarshalling them (its decoding then takes less of the cores it shares with the server; with -pin, of its own core)")
	flag.BoolVar(&o.fixedWindows, "fixed-windows", false, "the fleet dials with fixed flow-control windows (as Envoy and kds-host's zones) instead of grpc-go's defaults")
	flag.StringVar(&o.out, "out", "bench-results/guardfleet", "directory for guardfleet.txt and guardfleet.json (\"\": write nothing)")
	flag.StringVar(&o.bin, "bin", "", "directory holding a prebuilt xds-server (default: build it into a temp dir)")
	flag.DurationVar(&o.syncTimeout, "sync-timeout", 5*time.Minute, "give up a full sync after this long")
	flag.DurationVar(&o.updateTimeout, "update-timeout", 2*time.Minute, "give up an update that has not reached every stream after this long")

	var fc fleetConfig
	flag.StringVar(&fc.addr, "fleet", "", "internal: be the fleet, against this xDS address")
	flag.IntVar(&fc.streams, "fleet-streams", 0, "internal: streams")
	flag.IntVar(&fc.streamsPerConn, "fleet-streams-per-conn", 10, "internal: streams per connection")
	flag.IntVar(&fc.clusters, "fleet-clusters", 100, "internal: clusters a stream holds once synced")
	flag.IntVar(&fc.updates, "fleet-updates", 0, "internal: updates to report")
	flag.BoolVar(&fc.delta, "fleet-delta", false, "internal: delta streams")
	flag.BoolVar(&fc.fixedWindows, "fleet-fixed-windows", false, "internal: fixed windows")
	flag.BoolVar(&fc.lean, "fleet-lean", false, "internal: SotW responses read lean")
	stockCache := flag.String("stock", "", "internal: be the stock server over this cache")
	stockFile := flag.String("stock-resources", "", "internal: the stock server's resources file")
	stockXDS := flag.String("stock-xds-addr", "", "internal: the stock server's xDS address")
	stockAdmin := flag.String("stock-admin-addr", "", "internal: the stock server's admin address")
	flag.Parse()

	switch {
	case fc.addr != "":
		exitOn("guardfleet fleet:", 1, runFleet(fc))
		return
	case *stockCache != "":
		exitOn("guardfleet stock:", 1, runStock(*stockCache, *stockFile, *stockXDS, *stockAdmin))
		return
	}
	var err error
	o.scenarios, err = parseScenarios(*scen)
	exitOn("guardfleet: -scenarios:", 2, err)
	o.caches, err = procstat.ParseList(*caches, allCaches)
	exitOn("guardfleet: -caches:", 2, err)
	if o.runs < 1 || o.updates < 1 || o.warmup < 0 || o.streamsPerConn < 1 || o.clusters < 1 || o.warmup+o.updates > o.clusters {
		exitOn("guardfleet:", 2, errors.New("-runs, -updates, -clusters and -streams-per-conn must be at least 1, -warmup at least 0, "+
			"and -warmup + -updates at most -clusters (each update changes another cluster)"))
	}
	o.command = strings.Join(append([]string{"guardfleet"}, os.Args[1:]...), " ")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	exitOn("guardfleet:", 1, run(ctx, o))
}

// exitOn prints what and err, and exits with code, when err is not nil.
func exitOn(what string, code int, err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, what, err)
		os.Exit(code)
	}
}

func parseScenarios(s string) ([]scenario, error) {
	var out []scenario
	for _, part := range strings.Split(s, ",") {
		proto, n, ok := strings.Cut(strings.TrimSpace(part), ":")
		streams, err := strconv.Atoi(n)
		if !ok || err != nil || streams < 1 || (proto != "sotw" && proto != "delta") {
			return nil, fmt.Errorf("%q: want PROTOCOL:STREAMS, such as sotw:1000 or delta:10000", part)
		}
		out = append(out, scenario{Delta: proto == "delta", Streams: streams})
	}
	return out, nil
}

// job is one server over one cache in one scenario.
type job struct {
	sc     scenario
	cache  string
	server string
}

// blocks are the jobs, a block per scenario and cache: its three servers, which each run
// rotates (procstat.RunOrder), so that no server always follows the same one.
func blocks(scenarios []scenario, caches []string) [][]job {
	var out [][]job
	for _, sc := range scenarios {
		for _, c := range caches {
			var b []job
			for _, sv := range allServers {
				b = append(b, job{sc, c, sv})
			}
			out = append(out, b)
		}
	}
	return out
}

// run measures every job o.runs times, interleaved.
func run(ctx context.Context, o options) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	bin := o.bin
	if bin == "" {
		dir, err := os.MkdirTemp("", "kds-bench-guardfleet-bin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if err := buildXDSServer(ctx, dir); err != nil {
			return err
		}
		bin = dir
	}
	rep := newReport(o)
	failed := map[job]bool{}
	for r := 1; r <= o.runs; r++ {
		for _, j := range procstat.RunOrder(blocks(o.scenarios, o.caches), r) {
			if failed[j] {
				continue
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			fmt.Fprintf(os.Stderr, "guardfleet: run %d/%d: %s, %s, %s...\n", r, o.runs, j.sc, j.cache, j.server)
			start := time.Now()
			fig, err := measure(ctx, o, self, filepath.Join(bin, "xds-server"), j)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				fmt.Fprintf(os.Stderr, "guardfleet: %s, %s, %s: %v (not run again)\n", j.sc, j.cache, j.server, err)
				rep.skip(j, fmt.Sprintf("run %d failed: %v", r, err))
				failed[j] = true
				continue
			}
			fmt.Fprintf(os.Stderr, "guardfleet: %s, %s, %s: %s in %s\n", j.sc, j.cache, j.server, fig.summary(), time.Since(start).Round(time.Second))
			rep.add(j, fig)
		}
	}
	rep.finish()
	rep.print(os.Stdout)
	if o.out != "" {
		if err := rep.write(o.out); err != nil {
			return err
		}
		fmt.Printf("\nwrote %s and %s\n", filepath.Join(o.out, "guardfleet.txt"), filepath.Join(o.out, "guardfleet.json"))
	}
	return nil
}

// buildXDSServer builds examples/xds-server into dir, from the module this program is in.
func buildXDSServer(ctx context.Context, dir string) error {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(out))
	if err != nil || mod == "" || mod == os.DevNull {
		return fmt.Errorf("find the module to build examples/xds-server from (run from the repository, or give -bin): %v", err)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(os.PathSeparator), "./examples/xds-server")
	cmd.Dir = filepath.Dir(mod)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build examples/xds-server: %w", err)
	}
	return nil
}
