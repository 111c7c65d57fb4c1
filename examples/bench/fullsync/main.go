// Command fullsync measures how long a full KDS sync takes, and the memory it peaks at, for
// 1 zone x 10,000 resources and 100 zones x 1,000 resources. A global and the zones run in
// this process, on loopback with plaintext KDS, each with its own SQLite store in a temp dir.
//
//	go run ./examples/bench/fullsync [-scenario all|1x10000|100x1000] [-tmp DIR]
//
// The global's store is filled first (Mesh "default" and N MeshTimeouts); then the global
// starts, and once it serves, every zone starts at once. The sync time runs from the zones'
// start until every zone's store holds all N+1 resources (the zone client's Applied hook counts
// what each zone stored; each store is then checked with List). Memory is sampled every 10 ms
// (runtime.MemStats) while the global starts and the zones sync; VmHWM is the kernel's peak
// resident set over the same span (reset before the global starts).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kds-host/kds-host/examples/bench/internal/benchcp"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

// scenario is one measurement: Zones zones, each syncing Mesh "default" and Resources
// MeshTimeouts.
type scenario struct {
	Name      string
	Zones     int
	Resources int
}

var scenarios = []scenario{
	{"1x10000", 1, 10000},
	{"100x1000", 100, 1000},
}

// result is what one scenario measured.
type result struct {
	scenario
	GlobalReady time.Duration // from starting the global until it serves KDS
	Sync        time.Duration // from starting the zones until the last one holds everything
	ZoneP50     time.Duration // median zone's sync time
	HeapStart   uint64        // HeapInuse before the global started
	PeakHeap    uint64        // peak HeapInuse
	PeakSys     uint64        // peak runtime Sys
	HWM         uint64        // VmHWM
	NACKs       int64         // NACKs sent by all zones
	Note        string
}

func main() {
	os.Exit(run())
}

func run() int {
	which := flag.String("scenario", "all", "all, one of "+names()+", or any ZONESxRESOURCES")
	tmp := flag.String("tmp", "", "directory for the temp dirs of the stores (default: the system temp dir)")
	logLevel := flag.String("log", "off", "log level of the control planes: off, error, warn, info, debug")
	timeout := flag.Duration("timeout", 10*time.Minute, "give up a scenario after this long")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the runs (from the global's start to the last zone's sync) to this file")
	ownerHolds := flag.Bool("owner-holds", true, "hold resources back until their owner is on the zone (kds-host run's default); false measures the global without")
	memProfile := flag.String("memprofile", "", "write a heap profile, taken when the last zone is synced, to FILE.SCENARIO")
	flag.Parse()

	todo := scenarios
	if *which != "all" {
		sc, err := parseScenario(*which)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fullsync: -scenario: %v\n", err)
			return 2
		}
		todo = []scenario{sc}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var results []result
	code := 0
	for _, sc := range todo {
		fmt.Fprintf(os.Stderr, "fullsync: %s: %d zone(s) x %d resources...\n", sc.Name, sc.Zones, sc.Resources)
		prof := profiles{cpu: *cpuProfile}
		if *memProfile != "" {
			prof.mem = *memProfile + "." + sc.Name
		}
		if prof.cpu != "" && len(todo) > 1 {
			prof.cpu += "." + sc.Name
		}
		r, err := measure(ctx, sc, *tmp, *logLevel, *ownerHolds, *timeout, prof)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fullsync: %s: %v\n", sc.Name, err)
			code = 1
			break
		}
		results = append(results, r)
	}
	if len(results) > 0 {
		printTable(os.Stdout, results)
	}
	return code
}

// parseScenario reads ZONESxRESOURCES, e.g. 100x1000.
func parseScenario(s string) (scenario, error) {
	z, r, ok := strings.Cut(s, "x")
	zones, zerr := strconv.Atoi(z)
	resources, rerr := strconv.Atoi(r)
	if !ok || zerr != nil || rerr != nil || zones < 1 || resources < 1 {
		return scenario{}, fmt.Errorf("%q: want all, or ZONESxRESOURCES such as %s", s, names())
	}
	return scenario{Name: s, Zones: zones, Resources: resources}, nil
}

func names() string {
	var n []string
	for _, sc := range scenarios {
		n = append(n, sc.Name)
	}
	return strings.Join(n, ", ")
}

// progress counts what one zone stored.
type progress struct {
	stored atomic.Int64
	done   atomic.Int64 // nanoseconds since the zones started, once everything is stored
}

// measure runs one scenario and stops (and removes) everything it started, whatever happens.
func measure(ctx context.Context, sc scenario, tmp, logLevel string, ownerHolds bool, timeout time.Duration, prof profiles) (res result, err error) {
	res.scenario = sc
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	dir, err := os.MkdirTemp(tmp, "kds-bench-fullsync-*")
	if err != nil {
		return res, err
	}
	defer func() {
		if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
			err = rerr
		}
	}()
	reg := resource.Default()
	want := int64(sc.Resources) + 1 // and the Mesh

	// The global's store: Mesh "default" and Resources MeshTimeouts.
	gst, err := benchcp.OpenSQLite(ctx, filepath.Join(dir, "global"))
	if err != nil {
		return res, err
	}
	defer gst.Close()
	rs := make([]resource.Resource, 0, sc.Resources+1)
	rs = append(rs, benchcp.Mesh("default"))
	for i := 1; i <= sc.Resources; i++ {
		rs = append(rs, benchcp.Timeout("default", fmt.Sprintf("timeout-%05d", i), time.Duration(i)*time.Millisecond))
	}
	if err := benchcp.Fill(ctx, gst, rs, 1000); err != nil {
		return res, fmt.Errorf("fill the global's store: %w", err)
	}
	rs = nil

	// The zones' stores, opened (and migrated) before anything is timed.
	zstores := make([]store.Store, sc.Zones)
	defer func() {
		for _, st := range zstores {
			if st != nil {
				st.Close()
			}
		}
	}()
	for i := range zstores {
		if zstores[i], err = benchcp.OpenSQLite(ctx, filepath.Join(dir, fmt.Sprintf("zone-%03d", i))); err != nil {
			return res, err
		}
	}

	// Every zone counts what it stored; the last to hold everything closes allDone.
	progs := make([]*progress, sc.Zones)
	allDone := make(chan struct{})
	var remaining atomic.Int64
	remaining.Store(int64(sc.Zones))
	var zonesStarted time.Time // set before any zone runs
	applied := func(p *progress) func(string, []resource.Key) {
		return func(_ string, stored []resource.Key) {
			if p.stored.Add(int64(len(stored))) >= want && p.done.CompareAndSwap(0, int64(time.Since(zonesStarted))) {
				if remaining.Add(-1) == 0 {
					close(allDone)
				}
			}
		}
	}

	// Memory: a clean start, then a sample every 10 ms until the zones are done.
	runtime.GC()
	debug.FreeOSMemory()
	hwmNote := ""
	if err := benchcp.ResetHWM(); err != nil {
		hwmNote = "VmHWM not reset (" + err.Error() + "): it includes the fill"
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.HeapStart = ms.HeapInuse
	sampler := startSampler(10 * time.Millisecond)
	defer sampler.stop()
	stopCPU := func() {}
	if prof.cpu != "" {
		if stopCPU, err = startCPUProfile(prof.cpu); err != nil {
			return res, err
		}
		defer stopCPU()
	}

	began := time.Now()
	gl, err := benchcp.StartGlobal(ctx, controlplane.GlobalConfig{
		Store: gst, Registry: reg, Logger: benchcp.Logger(logLevel, "global"), Builtin: retrypolicy.New(),
		OwnerHolds: ownerHolds, OwnerCheckTimeout: time.Second,
	})
	if err != nil {
		return res, err
	}
	defer func() {
		if serr := gl.Stop(); serr != nil && err == nil {
			err = fmt.Errorf("stop the global: %w", serr)
		}
	}()
	res.GlobalReady = time.Since(began)

	zones := make([]*benchcp.Zone, sc.Zones)
	defer func() {
		if serr := stopZones(zones); serr != nil && err == nil {
			err = serr
		}
	}()
	for i := range zones {
		progs[i] = &progress{}
		name := fmt.Sprintf("zone-%03d", i)
		z, err := benchcp.NewZone(name, gl.KDSAddr(), zstores[i], reg, benchcp.Logger(logLevel, name),
			zone.Config{Applied: applied(progs[i])})
		if err != nil {
			return res, err
		}
		zones[i] = z
	}
	zonesStarted = time.Now()
	for _, z := range zones {
		z.Start(ctx)
	}
	select {
	case <-allDone:
		res.Sync = time.Since(zonesStarted)
	case <-ctx.Done():
		return res, fmt.Errorf("zones not synced: %w (%s)", ctx.Err(), describe(progs, want))
	}
	peak := sampler.stop()
	stopCPU()
	if prof.mem != "" {
		if err := writeHeapProfile(prof.mem); err != nil {
			return res, err
		}
	}
	res.PeakHeap, res.PeakSys = peak.HeapInuse, peak.Sys
	if _, res.HWM, err = benchcp.ProcStatus(); err != nil {
		return res, err
	}
	var times []time.Duration
	for _, p := range progs {
		times = append(times, time.Duration(p.done.Load()))
	}
	slices.Sort(times)
	res.ZoneP50 = times[len(times)/2]

	// What the hooks counted must be what the stores hold.
	for i, st := range zstores {
		rs, err := st.List(ctx, "", "")
		if err != nil {
			return res, err
		}
		if int64(len(rs)) != want {
			return res, fmt.Errorf("zone-%03d holds %d resources, want %d", i, len(rs), want)
		}
	}
	for _, z := range zones {
		res.NACKs += z.Client.Stats().NACKs
	}
	res.Note = hwmNote
	return res, nil
}

// profiles names the profiles to write; empty: none.
type profiles struct{ cpu, mem string }

func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			f.Close()
		})
	}, nil
}

// writeHeapProfile writes the heap profile as of now: in-use figures are those of the last GC.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("heap").WriteTo(f, 0)
}

// stopZones stops every zone at once and returns the first error.
func stopZones(zones []*benchcp.Zone) error {
	var wg sync.WaitGroup
	errs := make([]error, len(zones))
	for i, z := range zones {
		if z == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := z.Stop(); err != nil {
				errs[i] = fmt.Errorf("stop %s: %w", z.Name, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func describe(progs []*progress, want int64) string {
	done, stored := 0, int64(0)
	for _, p := range progs {
		if p.done.Load() != 0 {
			done++
		}
		stored += p.stored.Load()
	}
	return fmt.Sprintf("%d of %d zones done, %d of %d resources stored", done, len(progs), stored, want*int64(len(progs)))
}

// sampler records the peak of runtime.MemStats' HeapInuse and Sys.
type sampler struct {
	quit chan struct{}
	done chan struct{}
	once sync.Once
	peak runtime.MemStats
}

func startSampler(every time.Duration) *sampler {
	s := &sampler{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			s.peak.HeapInuse = max(s.peak.HeapInuse, ms.HeapInuse)
			s.peak.Sys = max(s.peak.Sys, ms.Sys)
			select {
			case <-s.quit:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// stop ends the sampling (after one last sample) and returns the peaks.
func (s *sampler) stop() runtime.MemStats {
	s.once.Do(func() { close(s.quit) })
	<-s.done
	return s.peak
}

func printTable(w *os.File, results []result) {
	fmt.Fprintf(w, "\nfull sync, %s, GOMAXPROCS=%d, %s/%s\n\n", runtime.Version(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tzones\tresources/zone\tglobal ready\tfull sync time\tmedian zone\theap at start\tpeak heap\tpeak Sys\tVmHWM\tNACKs\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", r.Name, r.Zones, r.Resources,
			roundMs(r.GlobalReady), roundMs(r.Sync), roundMs(r.ZoneP50),
			benchcp.MiB(r.HeapStart), benchcp.MiB(r.PeakHeap), benchcp.MiB(r.PeakSys), benchcp.MiB(r.HWM), r.NACKs)
	}
	tw.Flush()
	for _, r := range results {
		if r.Note != "" {
			fmt.Fprintf(w, "%s: %s\n", r.Name, r.Note)
		}
	}
	fmt.Fprintln(w, "\nresources/zone: MeshTimeouts, plus Mesh \"default\"; global ready is the first snapshot; full sync time runs from the zones' start;")
	fmt.Fprintln(w, "heap and VmHWM cover the global and every zone, all in this process, from the global's start to the last zone's sync.")
}

func roundMs(d time.Duration) string { return d.Round(time.Millisecond).String() }
