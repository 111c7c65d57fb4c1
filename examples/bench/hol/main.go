// Command hol measures head-of-line blocking on a KDS stream: with K kinds NACK-looping on the
// one stream of a zone, how long an update of a healthy kind (a MeshTimeout) takes to reach the
// zone's store, against the run with nothing failing. kds-host retries asynchronously, so its
// p99 should stay within 2x of that baseline; the emulated Kuma 2.3-2.7 behaviours
// (--emulate blocking-per-type, blocking-per-stream) sleep inside the stream's callbacks and
// grow with K.
//
//	go run ./examples/bench/hol [-k 0,1,8,32] [-modes async,blocking-per-type,blocking-per-stream]
//
// Each run starts a global and one zone in this process (plaintext KDS on loopback, SQLite
// stores in a temp dir). The global holds Mesh "default", one resource of each of K extra
// mesh-scoped kinds (FailingKind00...) and the MeshTimeout "healthy". The zone has an admission
// outage for every failing kind, so it NACKs each of their responses, forever. In async mode the
// retry policy is "fixed" with a short delay, so the loop turns fast. Once every failing kind has
// NACKed a few times, the MeshTimeout is updated on the global's store, one update at a time,
// and the latency runs from the store write until the zone's Applied hook reports the zone
// stored it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/examples/bench/internal/benchcp"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

// modeAsync is kds-host's own retry: the scheduler, off the stream's goroutine.
const modeAsync = "async"

var allModes = []string{modeAsync, retry.EmulatePerType, retry.EmulatePerStream}

// options are the flags.
type options struct {
	ks              []int
	rounds          int
	modes           []string
	updates         int
	blockingUpdates int
	warmup          int
	retryDelay      time.Duration
	nackBackoff     time.Duration
	gap             time.Duration
	updateTimeout   time.Duration
	extra           int
	ownerHolds      bool
	tmp             string
	logLevel        string
}

// result is one (mode, K) run.
type result struct {
	mode      string
	k         int
	latencies []time.Duration // sorted
	roundP99  []time.Duration // each round's p99, when rounds are pooled
	nacks     int64           // NACKs the zone sent while the updates ran
	sessions  int             // KDS streams the zone opened beyond the first (reconnects)
	elapsed   time.Duration   // how long the updates ran
}

// merge pools one round's run into r.
func (r *result) merge(o result) {
	r.latencies = append(r.latencies, o.latencies...)
	slices.Sort(r.latencies)
	r.roundP99 = append(r.roundP99, o.quantile(0.99))
	r.nacks += o.nacks
	r.sessions += o.sessions
	r.elapsed += o.elapsed
}

func (r result) quantile(q float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	// Nearest rank.
	i := int(math.Ceil(q*float64(len(r.latencies)))) - 1
	return r.latencies[max(0, min(i, len(r.latencies)-1))]
}

func main() {
	os.Exit(run())
}

func run() int {
	var o options
	ks := flag.String("k", "0,1,8,32", "numbers of NACK-looping kinds, comma-separated")
	modes := flag.String("modes", strings.Join(allModes, ","), "retry modes, comma-separated: "+strings.Join(allModes, ", "))
	flag.IntVar(&o.rounds, "rounds", 3, "runs of every (mode, K), interleaved; their samples are pooled")
	flag.IntVar(&o.updates, "updates", 200, "measured updates of the healthy MeshTimeout per run (async mode)")
	flag.IntVar(&o.blockingUpdates, "blocking-updates", 15, "measured updates per run in the blocking modes (each takes about K x -nack-backoff)")
	flag.IntVar(&o.warmup, "warmup", 5, "updates before measuring, not counted")
	flag.DurationVar(&o.retryDelay, "retry-delay", 20*time.Millisecond, "async mode: the delay of the fixed retry policy")
	flag.DurationVar(&o.nackBackoff, "nack-backoff", 50*time.Millisecond, "blocking modes: the sleep inside the callback (--nack-backoff)")
	flag.DurationVar(&o.gap, "gap", 25*time.Millisecond, "pause between updates: random in [0, gap), so updates fall at every phase of the retry loop")
	flag.DurationVar(&o.updateTimeout, "update-timeout", time.Minute, "give up when an update has not reached the zone after this long")
	flag.IntVar(&o.extra, "extra", 0, "more MeshTimeouts on the global (and synced to the zone) besides the healthy one, to see how store size affects update latency")
	flag.BoolVar(&o.ownerHolds, "owner-holds", true, "hold resources back until their owner is on the zone, as kds-host run does by default; false measures the global without")
	flag.StringVar(&o.tmp, "tmp", "", "directory for the temp dirs of the stores (default: the system temp dir)")
	flag.StringVar(&o.logLevel, "log", "off", "log level of the control planes: off, error, warn, info, debug")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of every run (warm-up excluded) to this file")
	check := flag.Bool("check", false, "exit with status 1 when an async p99 exceeds 2x the baseline")
	flag.Parse()

	for _, s := range strings.Split(*ks, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || k < 0 || k > 99 {
			fmt.Fprintf(os.Stderr, "hol: -k %q: want numbers 0..99\n", *ks)
			return 2
		}
		if !slices.Contains(o.ks, k) {
			o.ks = append(o.ks, k)
		}
	}
	if o.rounds < 1 || o.updates < 1 || o.blockingUpdates < 1 {
		fmt.Fprintln(os.Stderr, "hol: -rounds, -updates and -blocking-updates must be at least 1")
		return 2
	}
	for _, m := range strings.Split(*modes, ",") {
		m = strings.TrimSpace(m)
		if !slices.Contains(allModes, m) {
			fmt.Fprintf(os.Stderr, "hol: -modes: unknown mode %q (want %s)\n", m, strings.Join(allModes, ", "))
			return 2
		}
		if !slices.Contains(o.modes, m) {
			o.modes = append(o.modes, m)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// One unmeasured run first, so the first measured one (the baseline) does not pay for
	// what a process does once: page faults in new code, the first SQLite and gRPC use.
	fmt.Fprintln(os.Stderr, "hol: warm-up run (not measured)...")
	if _, err := measure(ctx, o, modeAsync, 0, 20); err != nil {
		fmt.Fprintf(os.Stderr, "hol: warm-up run: %v\n", err)
		return 1
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "hol: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(os.Stderr, "hol: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}

	var results []result
	code := 0
	for _, mode := range o.modes {
		for _, k := range o.ks {
			results = append(results, result{mode: mode, k: k})
		}
	}
	// Round after round, every (mode, K) once, so that a noisy spell of a shared machine is
	// spread over all of them rather than landing on one; the samples are pooled.
runs:
	for round := range o.rounds {
		for i := range results {
			r := &results[i]
			n := o.updates
			if r.mode != modeAsync {
				n = o.blockingUpdates
			}
			fmt.Fprintf(os.Stderr, "hol: round %d/%d: %s, K=%d: %d updates...\n", round+1, o.rounds, r.mode, r.k, n)
			got, err := measure(ctx, o, r.mode, r.k, n)
			if err != nil {
				fmt.Fprintf(os.Stderr, "hol: %s, K=%d: %v\n", r.mode, r.k, err)
				code = 1
				break runs
			}
			r.merge(got)
		}
	}
	results = slices.DeleteFunc(results, func(r result) bool { return len(r.latencies) == 0 })
	if len(results) > 0 && !printResults(os.Stdout, o, results) && *check && code == 0 {
		code = 1
	}
	return code
}

// measure runs one (mode, K): it starts a global and a zone, waits for the NACK loop to turn,
// times n updates, and stops (and removes) everything it started, whatever happens.
func measure(ctx context.Context, o options, mode string, k, n int) (res result, err error) {
	res.mode, res.k = mode, k
	dir, err := os.MkdirTemp(o.tmp, "kds-bench-hol-*")
	if err != nil {
		return res, err
	}
	defer func() {
		if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
			err = rerr
		}
	}()

	reg := resource.Default()
	var failing []string
	for i := range k {
		name := fmt.Sprintf("FailingKind%02d", i)
		if err := reg.Register(resource.Kind{Name: name, Plural: strings.ToLower(name) + "s", Scope: resource.ScopeMesh}); err != nil {
			return res, err
		}
		failing = append(failing, name)
	}

	gst, err := benchcp.OpenSQLite(ctx, filepath.Join(dir, "global"))
	if err != nil {
		return res, err
	}
	defer gst.Close()
	healthy := benchcp.Timeout("default", "healthy", time.Second)
	seed := []resource.Resource{benchcp.Mesh("default"), healthy}
	for _, kind := range failing {
		seed = append(seed, resource.Resource{Kind: kind, Mesh: "default", Name: "failing", Spec: json.RawMessage(`{"n":1}`), Generation: 1})
	}
	for i := range o.extra {
		seed = append(seed, benchcp.Timeout("default", fmt.Sprintf("extra-%05d", i), time.Duration(i+1)*time.Millisecond))
	}
	if err := benchcp.Fill(ctx, gst, seed, 1000); err != nil {
		return res, fmt.Errorf("fill the global's store: %w", err)
	}

	gcfg := controlplane.GlobalConfig{Store: gst, Registry: reg, Logger: benchcp.Logger(o.logLevel, "global"), OwnerHolds: o.ownerHolds}
	if mode == modeAsync {
		forcer := retrypolicy.New()
		pcfg, err := retrypolicy.Parse([]byte(fmt.Sprintf("policy: fixed\ndelay: %s\n", o.retryDelay)))
		if err != nil {
			return res, err
		}
		if err := forcer.Apply(pcfg); err != nil {
			return res, err
		}
		gcfg.Builtin = forcer
	} else {
		gcfg.Builtin = retrypolicy.New()
		gcfg.Emulate, gcfg.NACKBackoff = mode, o.nackBackoff
	}
	gl, err := benchcp.StartGlobal(ctx, gcfg)
	if err != nil {
		return res, err
	}
	defer func() {
		if serr := gl.Stop(); serr != nil && err == nil {
			err = fmt.Errorf("stop the global: %w", serr)
		}
	}()

	zst, err := benchcp.OpenSQLite(ctx, filepath.Join(dir, "zone"))
	if err != nil {
		return res, err
	}
	defer zst.Close()
	// The hook reports when the zone stored the healthy MeshTimeout (it runs on the zone's
	// stream goroutine: send without blocking; updates go one at a time, so one slot is enough,
	// and the spare slots only guard against a resend).
	arrived := make(chan time.Time, 16)
	outage := map[string]time.Duration{}
	for _, kind := range failing {
		outage[kind] = 24 * time.Hour
	}
	z, err := benchcp.NewZone("zone-1", gl.KDSAddr(), zst, reg, benchcp.Logger(o.logLevel, "zone-1"), zone.Config{
		AdmissionOutage: outage,
		Applied: func(kind string, stored []resource.Key) {
			if kind == healthy.Kind && slices.Contains(stored, healthy.Key()) {
				select {
				case arrived <- time.Now():
				default:
				}
			}
		},
	})
	if err != nil {
		return res, err
	}
	z.Start(ctx)
	defer func() {
		if serr := z.Stop(); serr != nil && err == nil {
			err = fmt.Errorf("stop the zone: %w", serr)
		}
	}()

	// The first sync, then the NACK loop must be turning: every failing kind NACKed 3 times.
	if _, err := wait(ctx, arrived, o.updateTimeout); err != nil {
		return res, fmt.Errorf("first sync of the healthy MeshTimeout: %w", err)
	}
	if err := waitNACKLoop(ctx, z, failing, 3, time.Minute); err != nil {
		return res, err
	}

	update := func(i int) (time.Duration, error) {
		r := benchcp.Timeout("default", "healthy", time.Duration(i+2)*time.Second)
		r.Generation = 0
		if err := reg.Validate(&r); err != nil {
			return 0, err
		}
		drain(arrived)
		start := time.Now()
		if _, changed, err := gst.Put(ctx, r); err != nil || !changed {
			return 0, fmt.Errorf("update %d: changed=%v, %v", i, changed, err)
		}
		at, err := wait(ctx, arrived, o.updateTimeout)
		if err != nil {
			return 0, fmt.Errorf("update %d did not reach the zone: %w", i, err)
		}
		return at.Sub(start), nil
	}
	pause := func() {
		if o.gap > 0 {
			time.Sleep(rand.N(o.gap))
		}
	}
	for i := range o.warmup {
		if _, err := update(i); err != nil {
			return res, err
		}
		pause()
	}
	nacks0 := z.Client.Stats().NACKs
	began := time.Now()
	last := 0
	for i := range n {
		last = o.warmup + i
		d, err := update(last)
		if err != nil {
			return res, err
		}
		res.latencies = append(res.latencies, d)
		pause()
	}
	res.elapsed = time.Since(began)
	stats := z.Client.Stats()
	res.nacks = stats.NACKs - nacks0
	res.sessions = stats.Sessions - 1
	slices.Sort(res.latencies)

	// The zone holds the last update, and the failing kinds never got in.
	got, err := zst.Get(ctx, healthy.Key())
	if err != nil {
		return res, err
	}
	if want := fmt.Sprintf("%q", (time.Duration(last+2) * time.Second).String()); !strings.Contains(string(got.Spec), want) {
		return res, fmt.Errorf("the zone holds %s, want connectionTimeout %s", got.Spec, want)
	}
	for _, kind := range failing {
		if rs, err := zst.List(ctx, kind, ""); err != nil || len(rs) != 0 {
			return res, fmt.Errorf("the zone holds %d %s (%v): the outage should refuse them", len(rs), kind, err)
		}
	}
	if k > 0 && res.nacks == 0 {
		return res, errors.New("no NACK while the updates ran: the NACK loop stopped")
	}
	return res, nil
}

// wait returns the next time on ch.
func wait(ctx context.Context, ch <-chan time.Time, timeout time.Duration) (time.Time, error) {
	select {
	case t := <-ch:
		return t, nil
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	case <-time.After(timeout):
		return time.Time{}, fmt.Errorf("nothing after %s", timeout)
	}
}

func drain(ch <-chan time.Time) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// waitNACKLoop waits until the zone has NACKed every failing kind at least times times.
func waitNACKLoop(ctx context.Context, z *benchcp.Zone, failing []string, times int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		byKind := z.Client.Stats().NACKByKind
		turning := 0
		for _, kind := range failing {
			if byKind[kind] >= times {
				turning++
			}
		}
		if turning == len(failing) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("NACK loop not running after %s: %d of %d failing kinds NACKed %d times", timeout, turning, len(failing), times)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// printResults prints the table and a verdict per K, and reports whether every async verdict
// holds.
func printResults(w *os.File, o options, results []result) bool {
	fmt.Fprintf(w, "\nhead-of-line blocking, %s, GOMAXPROCS=%d, %s/%s; async: fixed %s retry; blocking: %s sleep per NACK\n\n",
		runtime.Version(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, o.retryDelay, o.nackBackoff)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tK\tupdates\tp50\tp99\tmax\tmean\tNACKs\tNACKs/s\treconnects\tp99 of each round\t")
	for _, r := range results {
		var sum time.Duration
		for _, d := range r.latencies {
			sum += d
		}
		mean := sum / time.Duration(max(1, len(r.latencies)))
		var rounds []string
		for _, d := range r.roundP99 {
			rounds = append(rounds, fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%d\t%.0f\t%d\t%s ms\t\n", r.mode, r.k, len(r.latencies),
			benchcp.Ms(r.quantile(0.5)), benchcp.Ms(r.quantile(0.99)), benchcp.Ms(r.quantile(1)), benchcp.Ms(mean),
			r.nacks, float64(r.nacks)/r.elapsed.Seconds(), r.sessions, strings.Join(rounds, " / "))
	}
	tw.Flush()
	fmt.Fprintln(w)

	find := func(mode string, k int) (result, bool) {
		for _, r := range results {
			if r.mode == mode && r.k == k {
				return r, true
			}
		}
		return result{}, false
	}
	base, ok := find(modeAsync, 0)
	if !ok {
		fmt.Fprintln(w, "no verdict: the baseline (async, K=0) was not run")
		return true
	}
	baseP99 := base.quantile(0.99)
	allOK := true
	for _, k := range o.ks {
		if k == 0 {
			continue
		}
		line := fmt.Sprintf("K=%-2d:", k)
		if r, ok := find(modeAsync, k); ok {
			ratio := float64(r.quantile(0.99)) / float64(baseP99)
			verdict := "ok"
			if ratio > 2 {
				verdict, allOK = "FAIL", false
			}
			line += fmt.Sprintf(" async p99 / baseline p99 = %.2f (must be <= 2) %s [p50 ratio %.2f]", ratio, verdict,
				float64(r.quantile(0.5))/float64(base.quantile(0.5)))
		}
		for _, mode := range allModes[1:] {
			if r, ok := find(mode, k); ok {
				line += fmt.Sprintf("; %s p99 / baseline p99 = %.2f", mode, float64(r.quantile(0.99))/float64(baseP99))
			}
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w, "\nlatency: from the write to the global's store until the zone has stored the update; baseline: async, K=0.")
	return allOK
}
