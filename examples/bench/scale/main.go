// Command scale measures one global serving many zones, side by side with a stock
// go-control-plane server: for each scenario (zones x resources) and each server (kds-host with
// owner holds on, its default; kds-host with owner holds off; examples/bench/stock, a
// go-control-plane v0.14 LinearCache server with the same resources; and, over state-of-the-world
// streams, stock and the guard package over stock's caches; and, when asked, the floor: grpc-go
// with no cache, the least any server does for the same zones), it starts the server as a child
// process and the zones in another (raw delta or SotW xDS clients that subscribe Mesh and
// MeshTimeout and ACK everything, with zone tokens for kds-host), so that the server's CPU
// (/proc/PID/stat) and peak resident set (VmHWM, /proc/PID/status) are its own. It measures the
// full sync (time, resources/s, server CPU), one update reaching every zone (p50 and max over
// -updates updates, server CPU per update), server CPU while idle with every zone connected,
// the peak RSS and the live heap after GC; prints a table and the ratios the issue's "Must
// hold" names; and writes bench-results/scale.json, latency.svg and cpu.svg.
//
//	go run ./examples/bench/scale                                      # everything, once
//	go run ./examples/bench/scale -scenarios 100x1000 -updates 5 -idle 3s -out /tmp/bench   # a minute
//	go run ./examples/bench/scale -runs 3                              # medians of 3 (make bench)
//	go run ./examples/bench/scale -scenarios 100x10000 -servers holds-on --cpuprofile prof/
//
// See docs/benchmarks.md for what each figure means.
package main

import (
	"context"
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

// scenario is Zones zones, each syncing Mesh "default" and Resources MeshTimeouts.
type scenario struct {
	Zones     int `json:"zones"`
	Resources int `json:"resources"`
}

func (s scenario) String() string { return fmt.Sprintf("%dx%d", s.Zones, s.Resources) }

// allScenarios are issue 14's (100 and 1,000 zones x 1,000 and 10,000 resources) and issue
// 24's 10,000 clients (x 100 and x 1,000).
var allScenarios = []scenario{{100, 1000}, {1000, 1000}, {100, 10000}, {1000, 10000}, {10000, 100}, {10000, 1000}}

// manyZones is where a scenario's zones share connections by default (-streams-per-conn 0):
// one process cannot hold 10,000 client connections and their servers' within this machine's
// limits, and a fleet of that size is a fleet of proxies multiplexed by a few processes anyway.
const manyZones = 10000

// sharedStreams is the zone streams per connection from manyZones zones on, and the most
// -streams-per-conn takes: the benchserver's MaxStreamsPerConnection (16, kds-host's default);
// stock's gRPC server sets no limit.
const sharedStreams = 16

// streamsPerConnFor is the streams per connection a scenario runs with.
func (o options) streamsPerConnFor(sc scenario) int {
	if o.streamsPerConn > 0 {
		return o.streamsPerConn
	}
	if sc.Zones >= manyZones {
		return sharedStreams
	}
	return 1
}

// server is one of the servers measured.
type server string

const (
	holdsOn   server = "holds-on"        // kds-host, its defaults (delta: what kds-host's zones speak)
	holdsOff  server = "holds-off"       // kds-host, --owner-holds=false
	stock     server = "stock"           // go-control-plane v0.14 LinearCaches, delta
	guarded   server = "guard"           // the same caches through guard.New, delta
	stockSotW server = "stock-sotw"      // stock, state of the world
	guardSotW server = "guard-sotw"      // guard, state of the world
	floorOnly server = "floor"           // stock -floor: grpc-go alone, no cache (delta)
	noAuth    server = "holds-on-noauth" // kds-host, its defaults but --kds-auth=false: no zone token checked, as stock checks none
)

// knownServers are every server -servers takes; allServers are what "all" runs (the guard over
// delta only when asked: its delta figures follow its SotW ones, and each server of a scenario
// at 10,000 x 1,000 costs minutes).
var (
	knownServers = []server{holdsOn, holdsOff, stock, guarded, stockSotW, guardSotW, floorOnly, noAuth}
	allServers   = []server{holdsOn, holdsOff, stock, stockSotW, guardSotW}
)

// sotw: the server is measured with state-of-the-world streams.
func (s server) sotw() bool { return s == stockSotW || s == guardSotW }

// bytesPerZoneResource is a server's peak resident set per zone-resource, an overestimate (from
// 1,000 zones x 10,000 resources at 0cf2a10: 2.1 GiB, 3.9 GiB and 1.6 GiB, with room), used
// to skip a scenario that would not fit in memory.
var bytesPerZoneResource = map[server]uint64{holdsOn: 350, holdsOff: 600, stock: 250, guarded: 600, stockSotW: 250, guardSotW: 600, floorOnly: 250, noAuth: 350}

type options struct {
	scenarios      []scenario
	servers        []server
	runs           int
	updates        int
	warmup         int
	gap            time.Duration
	idle           time.Duration
	out            string
	cpuProfile     string
	bin            string
	tmp            string
	timeout        time.Duration
	syncTimeout    time.Duration
	updateTimeout  time.Duration
	streamsPerConn int
	defaultWindows bool
	check          bool
	noMemCheck     bool
	command        string
}

func main() {
	var o options
	scen := flag.String("scenarios", "all", "all, or ZONESxRESOURCES,... (all: 100x1000,1000x1000,100x10000,1000x10000,10000x100,10000x1000)")
	servers := flag.String("servers", "all", "all, or a comma list of holds-on, holds-off, stock, guard, stock-sotw, guard-sotw, floor, holds-on-noauth (all: every one but guard, floor and holds-on-noauth)")
	flag.IntVar(&o.runs, "runs", 1, "runs of everything; the figures are the runs' medians (runs are interleaved)")
	flag.IntVar(&o.updates, "updates", 20, "measured updates per run")
	flag.IntVar(&o.warmup, "warmup", 2, "unmeasured updates before them")
	flag.DurationVar(&o.gap, "gap", 100*time.Millisecond, "pause after each update has reached every zone")
	flag.DurationVar(&o.idle, "idle", 30*time.Second, "how long the idle server CPU is measured, every zone connected")
	flag.StringVar(&o.out, "out", "bench-results", "directory for scale.json, latency.svg and cpu.svg (\"\": write nothing)")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of each server process, from serving until the full sync is done, to DIR/SCENARIO-SERVER[-runN].pprof, from then until exit (updates, idle, heap, close) to ...after.pprof, its heap profile at the end to ...heap.pprof, and the zones' process's CPU profile to ...zones.pprof")
	flag.StringVar(&o.bin, "bin", "", "directory holding prebuilt benchserver and stock binaries (default: build them into a temp dir)")
	flag.StringVar(&o.tmp, "tmp", "", "where kds-host's SQLite temp dir goes (default: the system temp dir)")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up one server's run of one scenario after this long")
	flag.DurationVar(&o.syncTimeout, "sync-timeout", 5*time.Minute, "give up a full sync that has not finished after this long (the scenario is reported as skipped, with how far it got)")
	flag.DurationVar(&o.updateTimeout, "update-timeout", 2*time.Minute, "give up an update that has not reached every zone after this long")
	flag.IntVar(&o.streamsPerConn, "streams-per-conn", 0, "zone streams per gRPC connection (1: a connection per zone, as real zones have; 0: 1 below 10,000 zones, 16 from 10,000 on)")
	flag.BoolVar(&o.defaultWindows, "default-windows", false, "the zones dial with grpc-go's default (dynamic) flow-control windows, as a proxyless client does, instead of a kds-host zone's fixed ones")
	flag.BoolVar(&o.check, "check", false, "exit 1 when a \"must hold\" verdict is not met")
	flag.BoolVar(&o.noMemCheck, "no-mem-check", false, "run a scenario even when its estimated peak RSS exceeds MemAvailable")

	replot := flag.String("replot", "", "read a scale.json, print its table and write its SVG plots again (into -out), run nothing")
	breakdownOnly := flag.Bool("breakdown", false, "read the CPU profiles named after the flags (-cpuprofile's, or any Go CPU profile) and print where their samples went, by category (garbage collection, zone token checks, gRPC sends, ...), run nothing; needs the go command")

	var fc fleetConfig
	flag.StringVar(&fc.addr, "fleet", "", "internal: be the zones' process, against this KDS address")
	flag.IntVar(&fc.zones, "fleet-zones", 0, "internal: zones")
	flag.IntVar(&fc.resources, "fleet-resources", 0, "internal: MeshTimeouts each zone must hold")
	flag.StringVar(&fc.tokensFile, "fleet-tokens", "", "internal: zone tokens, one a line")
	flag.IntVar(&fc.updates, "fleet-updates", 0, "internal: updates to report")
	flag.IntVar(&fc.streamsPerConn, "fleet-streams-per-conn", 1, "internal: streams per connection")
	flag.BoolVar(&fc.sotw, "fleet-sotw", false, "internal: state-of-the-world streams instead of delta")
	flag.BoolVar(&fc.defaultWindows, "fleet-default-windows", false, "internal: grpc-go's default windows")
	flag.StringVar(&fc.cpuProfile, "fleet-cpuprofile", "", "internal: write the zones' process's CPU profile here")
	flag.Parse()

	if *breakdownOnly {
		breakdownMain(flag.Args())
		return
	}
	if fc.addr != "" {
		if err := runFleet(fc); err != nil {
			fmt.Fprintln(os.Stderr, "scale zones:", err)
			os.Exit(1)
		}
		return
	}
	if *replot != "" {
		if err := replotFile(*replot, o.out); err != nil {
			fmt.Fprintln(os.Stderr, "scale: -replot:", err)
			os.Exit(1)
		}
		return
	}
	var err error
	if o.scenarios, err = parseScenarios(*scen); err != nil {
		fmt.Fprintln(os.Stderr, "scale: -scenarios:", err)
		os.Exit(2)
	}
	if o.servers, err = parseServers(*servers); err != nil {
		fmt.Fprintln(os.Stderr, "scale: -servers:", err)
		os.Exit(2)
	}
	if o.runs < 1 || o.updates < 1 || o.warmup < 0 || o.streamsPerConn < 0 || o.streamsPerConn > sharedStreams {
		fmt.Fprintf(os.Stderr, "scale: -runs and -updates must be at least 1, -warmup at least 0, -streams-per-conn 0 to %d (the benchserver's limit)\n", sharedStreams)
		os.Exit(2)
	}
	o.command = strings.Join(append([]string{"scale"}, os.Args[1:]...), " ")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func parseScenarios(s string) ([]scenario, error) {
	if s == "all" {
		return allScenarios, nil
	}
	var out []scenario
	for _, part := range strings.Split(s, ",") {
		z, r, ok := strings.Cut(strings.TrimSpace(part), "x")
		zones, zerr := strconv.Atoi(z)
		resources, rerr := strconv.Atoi(r)
		if !ok || zerr != nil || rerr != nil || zones < 1 || resources < 1 {
			return nil, fmt.Errorf("%q: want all, or ZONESxRESOURCES,... such as 100x1000,1000x1000", part)
		}
		out = append(out, scenario{zones, resources})
	}
	return out, nil
}

func parseServers(s string) ([]server, error) {
	if s == "all" {
		return allServers, nil
	}
	return procstat.ParseList(s, knownServers)
}

// job is one server in one scenario.
type job struct {
	sc scenario
	sv server
}

// run measures every scenario and server, o.runs times, interleaved (run 1 of everything, then
// run 2, ...), so a noisy spell of a shared machine spreads over every figure; each run starts a
// scenario's servers one further along (procstat.RunOrder), so no server always follows the same one.
func run(ctx context.Context, o options) (int, error) {
	self, err := os.Executable()
	if err != nil {
		return 1, err
	}
	bin := o.bin
	if bin == "" {
		dir, err := os.MkdirTemp("", "kds-bench-scale-bin-")
		if err != nil {
			return 1, err
		}
		defer os.RemoveAll(dir)
		if err := buildServers(ctx, dir); err != nil {
			return 1, err
		}
		bin = dir
	}
	if o.cpuProfile != "" {
		if err := os.MkdirAll(o.cpuProfile, 0o755); err != nil {
			return 1, err
		}
	}
	rep := newReport(o)
	var blocks [][]job // a scenario's servers each
	for _, sc := range o.scenarios {
		var jobs []job
		for _, sv := range o.servers {
			need := uint64(sc.Zones) * uint64(sc.Resources) * bytesPerZoneResource[sv]
			if avail := procstat.MemAvailable(); !o.noMemCheck && avail > 0 && need > avail*8/10 {
				rep.skip(sc, sv, fmt.Sprintf("estimated peak RSS %.1f GiB is over 80%% of MemAvailable (%.1f GiB); -no-mem-check runs it anyway",
					float64(need)/(1<<30), float64(avail)/(1<<30)))
				continue
			}
			jobs = append(jobs, job{sc, sv})
		}
		blocks = append(blocks, jobs)
	}
	failed := map[job]bool{}
	for r := 1; r <= o.runs; r++ {
		for _, j := range procstat.RunOrder(blocks, r) {
			if failed[j] {
				continue
			}
			if ctx.Err() != nil {
				return 1, ctx.Err()
			}
			fmt.Fprintf(os.Stderr, "scale: run %d/%d: %s, %s...\n", r, o.runs, j.sc, j.sv)
			prof := ""
			if o.cpuProfile != "" {
				name := fmt.Sprintf("%s-%s.pprof", j.sc, j.sv)
				if o.runs > 1 {
					name = fmt.Sprintf("%s-%s-run%d.pprof", j.sc, j.sv, r)
				}
				prof = filepath.Join(o.cpuProfile, name)
			}
			start := time.Now()
			fig, err := measure(ctx, o, self, bin, j.sc, j.sv, prof)
			if err != nil {
				if ctx.Err() != nil {
					return 1, ctx.Err()
				}
				fmt.Fprintf(os.Stderr, "scale: %s, %s: %v (not run again)\n", j.sc, j.sv, err)
				rep.skip(j.sc, j.sv, fmt.Sprintf("run %d failed: %v", r, err))
				failed[j] = true
				continue
			}
			fmt.Fprintf(os.Stderr, "scale: %s, %s: %s in %s\n", j.sc, j.sv, fig.summary(), time.Since(start).Round(time.Second))
			rep.add(j.sc, j.sv, fig)
		}
	}
	rep.finish()
	rep.print(os.Stdout)
	if o.out != "" {
		if err := rep.write(o.out); err != nil {
			return 1, err
		}
		fmt.Printf("\nwrote %s, %s and %s\n", filepath.Join(o.out, "scale.json"), filepath.Join(o.out, "latency.svg"), filepath.Join(o.out, "cpu.svg"))
	}
	if o.check && !rep.allMet() {
		return 1, nil
	}
	return 0, nil
}

// buildServers builds benchserver and stock into dir, from the module this program is in.
func buildServers(ctx context.Context, dir string) error {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == os.DevNull {
		return fmt.Errorf("find the module to build the servers from (run from the repository, or give -bin): %v", err)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(os.PathSeparator), "./examples/bench/benchserver", "./examples/bench/stock")
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(out)))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build the servers: %w", err)
	}
	return nil
}
