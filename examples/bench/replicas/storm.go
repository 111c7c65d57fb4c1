package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/examples/bench/internal/benchcp"
	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/resource"
)

// stormConfig is section 4's flags.
type stormConfig struct {
	zones, runs, burst, changes int
	rateList                    string
	rates                       []float64 // rateList's
	wait, baseline              time.Duration
	writeRate                   float64
}

func (c *stormConfig) parse() error {
	c.rates = nil
	for _, f := range strings.Split(c.rateList, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r < 0 {
			return fmt.Errorf("-storm-arrival-rate %q: want rates of 0 (no bound) or more, comma-separated", c.rateList)
		}
		c.rates = append(c.rates, r)
	}
	switch {
	case c.zones < 3 || c.runs < 1 || c.burst < 1 || c.changes < 0:
		return fmt.Errorf("-storm-zones must be at least 3, -storm-runs and -storm-arrival-burst at least 1, -storm-changes at least 0")
	case c.writeRate <= 0 || c.baseline <= 0 || c.wait <= 0:
		return fmt.Errorf("-storm-write-rate, -storm-baseline and -storm-arrival-wait must be more than 0")
	}
	return nil
}

// stormCase is one configuration of the storm: the replicas' arrival rate, and how many
// resources change right after the kill.
type stormCase struct {
	rate    float64
	changes int
}

func (c stormCase) String() string {
	return fmt.Sprintf("arrival rate %s, %d changed", rateName(c.rate), c.changes)
}

// stormFigures is one storm's figures.
type stormFigures struct {
	victim string
	moved  int
	// served and inSync are, for each moved zone, the time from the kill until a stream of
	// another replica served it, and until it held (ACKed) what the zones on the survivors hold.
	served, inSync []time.Duration
	notInSync      int
	// Bytes, over the moved zones: what they hold once in sync but the probes (a full sync's),
	// what their first stream sent, and what was sent after they moved: of it, resources they
	// held already at the same version, and the latency probes.
	full, first, sent, resent, probes int64
	attempts, refused                 int // streams opened after the move, and refused by the arrival bound
	lost                              int // zones on the survivors whose stream ended
	// base and during are the write latencies to the zones on the survivors before the kill and
	// from the kill until every moved zone was in sync (window); after, those over as long as
	// the baseline from the kill (a storm over sooner has few writes of its own).
	base, during, after []time.Duration
	window              time.Duration
	// cpuBase and cpuStorm are the cores each survivor ("A"...) and "PostgreSQL" used over the
	// baseline and over the storm's window.
	cpuBase, cpuStorm map[string]float64
}

// storm kills one replica of three under cfg.zones zones, runs times for each configuration
// (interleaved), and prints what the moved zones took to be in sync, what they were sent, and
// what the zones on the survivors saw meanwhile.
func (b *bench) storm(pg int, cfg stormConfig) error {
	var cases []stormCase
	for _, r := range cfg.rates {
		cases = append(cases, stormCase{r, 0})
		if cfg.changes > 0 {
			cases = append(cases, stormCase{r, cfg.changes})
		}
	}
	figs := make([][]stormFigures, len(cases))
	for run := range cfg.runs {
		victim := []string{"C", "B", "A"}[run%3]
		for i, c := range cases {
			f, err := b.stormOnce(pg, victim, c, cfg)
			if err != nil {
				return fmt.Errorf("run %d, %s: %w", run+1, c, err)
			}
			figs[i] = append(figs[i], f)
		}
	}
	b.printStorm(cases, figs, cfg)
	return nil
}

// stormOnce is one storm: three replicas at c's arrival rate, cfg.zones zones spread over them,
// writes timed to the zones on the survivors through one of them for cfg.baseline, then the
// victim killed (kill -9) with the writes going on, c.changes resources changed, until every
// moved zone holds what the zones on the survivors hold.
func (b *bench) stormOnce(pg int, victim string, c stormCase, cfg stormConfig) (stormFigures, error) {
	fig := stormFigures{victim: victim, cpuBase: map[string]float64{}, cpuStorm: map[string]float64{}}
	b.stopAll()
	b.arrivals, b.arrivalWait = engine.RateLimit{Rate: c.rate, Burst: cfg.burst}, cfg.wait
	ids := []string{"A", "B", "C"}
	for _, id := range ids {
		if err := b.start(id); err != nil {
			return fig, err
		}
	}
	survivors := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == victim })
	writer := b.replicas[survivors[0]]
	b.seq++
	trial := b.seq
	var lines []string
	for i := range cfg.zones {
		home := i % 3
		others := []string{ids[(home+1)%3], ids[(home+2)%3]}
		if (i/3)%2 == 1 {
			others[0], others[1] = others[1], others[0] // half of each replica's zones fail over to each other replica
		}
		name := fmt.Sprintf("storm-%05d", i)
		tok, err := b.keys.Issue(auth.Claims{Kind: auth.KindZone, Name: name}, time.Hour, time.Now())
		if err != nil {
			return fig, err
		}
		lines = append(lines, fmt.Sprintf("%s %s %s,%s,%s", name, tok, b.kdsAddrs[ids[home]], b.kdsAddrs[others[0]], b.kdsAddrs[others[1]]))
	}
	file := filepath.Join(b.tmp, fmt.Sprintf("storm-%d", trial))
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		return fig, err
	}
	fl, err := benchcp.StartFleet("-storm-fleet", file, "-storm-victim", b.kdsAddrs[victim])
	if err != nil {
		return fig, err
	}
	f := newFleetProc(fl)
	defer f.close()
	time.Sleep(time.Second) // the first sync's last pushes are over
	before, err := f.status()
	if err != nil {
		return fig, err
	}

	// The writes, at a steady pace through a survivor, until stopped.
	type probe struct {
		name string
		at   time.Time
	}
	var probes []probe // the writer's until it is done
	stop, done := make(chan struct{}), make(chan error, 1)
	go func(stop <-chan struct{}) {
		tick := time.NewTicker(time.Duration(float64(time.Second) / cfg.writeRate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			case <-tick.C:
			}
			name := fmt.Sprintf("%s%d-%04d", probePrefix, trial, i)
			at := time.Now()
			if err := b.putTo(writer, name, "1s"); err != nil {
				done <- err
				return
			}
			probes = append(probes, probe{name, at})
		}
	}(stop)
	stopWrites := func() error {
		if stop == nil {
			return nil
		}
		close(stop)
		stop = nil
		return <-done
	}
	defer stopWrites()
	cpu := func() map[string]time.Duration {
		m := map[string]time.Duration{"PostgreSQL": treeCPU(pg)}
		for _, id := range survivors {
			m[id] = cpuTime([]int{b.replicas[id].cmd.Process.Pid})
		}
		return m
	}
	cores := func(a, b map[string]time.Duration, over time.Duration) map[string]float64 {
		m := map[string]float64{}
		for k := range a {
			m[k] = float64(b[k]-a[k]) / float64(over)
		}
		return m
	}
	cpu0, base0 := cpu(), time.Now()
	time.Sleep(cfg.baseline)
	cpu1, t0 := cpu(), time.Now()
	fig.cpuBase = cores(cpu0, cpu1, t0.Sub(base0))
	b.replicas[victim].kill()
	delete(b.replicas, victim)
	for k := range c.changes {
		if err := b.putTo(writer, fmt.Sprintf("t-%02d", k), fmt.Sprintf("%dms", 1000+10*trial+k)); err != nil {
			return fig, err
		}
	}
	var st stormStatus
	deadline := time.Now().Add(10 * time.Minute)
	for {
		if st, err = f.status(); err != nil {
			return fig, err
		}
		if st.moved == st.expected && st.inSync == st.moved && st.agree && (c.changes == 0 || st.ref != before.ref) {
			break
		}
		if time.Now().After(deadline) {
			return fig, fmt.Errorf("the storm did not settle within 10 minutes: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cpu2, t1 := cpu(), time.Now()
	fig.window = t1.Sub(t0)
	fig.cpuStorm = cores(cpu1, cpu2, fig.window)
	fig.lost = st.lost
	time.Sleep(time.Until(t0.Add(cfg.baseline)))
	if err := stopWrites(); err != nil {
		return fig, err
	}
	for _, p := range probes {
		got, err := f.wait(p.name, time.Minute)
		if err != nil {
			return fig, err
		}
		lat := got.Sub(p.at)
		if p.at.Before(t0) {
			fig.base = append(fig.base, lat)
			continue
		}
		if !p.at.After(t1) {
			fig.during = append(fig.during, lat)
		}
		if p.at.Before(t0.Add(cfg.baseline)) {
			fig.after = append(fig.after, lat)
		}
	}
	report, err := f.ask("report", "end", time.Minute)
	if err != nil {
		return fig, err
	}
	if err := fig.read(report, t0); err != nil {
		return fig, err
	}
	if err := f.close(); err != nil {
		return fig, fmt.Errorf("the storm's zones: %w", err)
	}
	// The probes go, so that every storm starts from the same resources.
	ac := &api.Client{BaseURL: "http://" + writer.api, HTTPClient: &http.Client{Timeout: 10 * time.Second}, Token: b.admin}
	mt, _ := resource.Default().Get("MeshTimeout")
	for _, p := range probes {
		if err := ac.Delete(context.Background(), mt, "default", p.name); err != nil {
			return fig, fmt.Errorf("delete %s: %w", p.name, err)
		}
	}
	return fig, nil
}

// read adds the storm fleet's report (stormFleet.command) to fig, the times from the kill at t0.
func (fig *stormFigures) read(report []string, t0 time.Time) error {
	for _, l := range report {
		fs := strings.Fields(l)
		if len(fs) == 0 || fs[0] != "moved" {
			continue
		}
		if len(fs) != 12 {
			return fmt.Errorf("the storm fleet's report: %q", l)
		}
		n := make([]int64, 0, 10)
		for _, s := range fs[2:] {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return fmt.Errorf("the storm fleet's report: %q", l)
			}
			n = append(n, v)
		}
		fig.moved++
		if n[1] > 0 {
			fig.served = append(fig.served, time.Unix(0, n[1]).Sub(t0))
		}
		if n[2] > 0 {
			fig.inSync = append(fig.inSync, time.Unix(0, n[2]).Sub(t0))
		} else {
			fig.notInSync++
		}
		fig.full += n[3]
		fig.first += n[4]
		fig.sent += n[5]
		fig.resent += n[6]
		fig.probes += n[7]
		fig.attempts += int(n[8])
		fig.refused += int(n[9])
	}
	if fig.moved == 0 || fig.notInSync > 0 {
		return fmt.Errorf("%d moved zones, %d of them not in sync", fig.moved, fig.notInSync)
	}
	return nil
}

// stormStatus is the storm fleet's answer to "status" (stormFleet.command).
type stormStatus struct {
	moved, expected, served, inSync, lost int
	agree                                 bool
	ref                                   string
}

func (f *fleetProc) status() (stormStatus, error) {
	var st stormStatus
	lines, err := f.ask("status", "status ", 10*time.Second)
	if err != nil {
		return st, err
	}
	var agree int
	if _, err := fmt.Sscanf(lines[len(lines)-1], "status %d %d %d %d %d %s %d", &st.moved, &st.expected, &st.served, &st.inSync, &agree, &st.ref, &st.lost); err != nil {
		return st, fmt.Errorf("the storm fleet's status %q: %w", lines[len(lines)-1], err)
	}
	st.agree = agree == 1
	return st, nil
}

// bytesShare is part's share of whole in percent.
func bytesShare(part, whole int64) float64 {
	if whole <= 0 {
		return 0
	}
	return 100 * float64(part) / float64(whole)
}

// printStorm prints every storm's figures, then each configuration's worst against the issue's
// limits.
func (b *bench) printStorm(cases []stormCase, figs [][]stormFigures, cfg stormConfig) {
	fmt.Printf("4. reconnect storm: %d zones over 3 replicas, one killed (kill -9) and its zones resuming on the others with initial_resource_versions; arrival burst %d, wait %s; writes timed to the zones on the survivors at %g/s, %s before the kill as the baseline\n",
		cfg.zones, cfg.burst, cfg.wait, cfg.writeRate, cfg.baseline)
	lat := func(ds []time.Duration) string {
		if len(ds) == 0 {
			return "-\t-\t-\t0"
		}
		return fmt.Sprintf("%s\t%s\t%s\t%d", benchcp.Ms(rank(ds, 50)), benchcp.Ms(rank(ds, 99)), benchcp.Ms(slices.Max(ds)), len(ds))
	}
	fmt.Println("4a. the moved zones: from the kill until a survivor served each, until each held (ACKed) what the zones on the survivors hold")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "run\tkilled\tarrival rate\tchanged\tmoved\tserved p50\tp99\tmax\tn\tin sync p50\tp99\tmax (all in sync)\tn\tstreams opened\trefused (arrivals)\tsurvivors' zones that lost their stream\t\n")
	for i, c := range cases {
		for run, f := range figs[i] {
			fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%d\t%s\t%s\t%d\t%d\t%d\t\n", run+1, f.victim, rateName(c.rate), c.changes, f.moved,
				lat(f.served), lat(f.inSync), f.attempts, f.refused, f.lost)
		}
	}
	w.Flush()
	fmt.Println("4b. bytes sent to the moved zones after they moved (proto sizes of the resources), against a full sync of what they hold once in sync (the latency probes apart)")
	w = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "run\tarrival rate\tchanged\tfull sync a zone\tsent but the probes\tof a full sync\tof it already held\tprobes\tfirst stream's\t\n")
	for i, c := range cases {
		for run, f := range figs[i] {
			per := func(v int64) string { return fmt.Sprintf("%d B", v/int64(f.moved)) }
			fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%s\t%.2f %%\t%s\t%s\t%s\t\n", run+1, rateName(c.rate), c.changes, per(f.full), per(f.sent-f.probes),
				bytesShare(f.sent-f.probes, f.full), per(f.resent), per(f.probes), per(f.first))
		}
	}
	w.Flush()
	fmt.Printf("4c. writes through a survivor timed until every zone on the survivors holds them: over %s before the kill (baseline), from the kill until every moved zone was in sync (storm), and over %s from the kill; CPU of each process over the baseline and the storm, in cores\n", cfg.baseline, cfg.baseline)
	w = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "run\tarrival rate\tchanged\tbaseline p50\tp99\tmax\tn\tstorm p50\tp99\tmax\tn\tafter the kill p50\tp99\tmax\tn\tstorm window\tCPU baseline: survivors\tPostgreSQL\tCPU storm: survivors\tPostgreSQL\t\n")
	for i, c := range cases {
		for run, f := range figs[i] {
			fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", run+1, rateName(c.rate), c.changes, lat(f.base), lat(f.during), lat(f.after), benchcp.Ms(f.window),
				survivorCores(f.cpuBase), fmt.Sprintf("%.2f", f.cpuBase["PostgreSQL"]), survivorCores(f.cpuStorm), fmt.Sprintf("%.2f", f.cpuStorm["PostgreSQL"]))
		}
	}
	w.Flush()
	for i, c := range cases {
		var p99, p99After, inSync time.Duration
		share, resent := 0.0, int64(0)
		for _, f := range figs[i] {
			if len(f.during) > 0 {
				p99 = max(p99, rank(f.during, 99))
			}
			if len(f.after) > 0 {
				p99After = max(p99After, rank(f.after, 99))
			}
			inSync = max(inSync, slices.Max(f.inSync))
			share = max(share, bytesShare(f.sent-f.probes, f.full))
			resent += f.resent
		}
		limit := ""
		if c.changes == 0 {
			limit = " (limit 5 %)"
		}
		fmt.Printf("  %s, worst of %d runs: every moved zone in sync after %s; survivors' write p99 during the storm %s (limit 1 s), over %s from the kill %s; sent %.2f %% of a full sync%s, %d B of it already held\n",
			c, len(figs[i]), benchcp.Ms(inSync), benchcp.Ms(p99), cfg.baseline, benchcp.Ms(p99After), share, limit, resent)
	}
	fmt.Println()
}

// rank is the nearest-rank percentile p of ds: the smallest value that at least p % of ds do not
// exceed (a storm's few writes: the p99 of 2 is the larger, not the smaller as pct's would be).
func rank(ds []time.Duration, p int) time.Duration {
	s := slices.Sorted(slices.Values(ds))
	return s[max(0, (len(s)*p+99)/100-1)]
}

func rateName(r float64) string {
	if r == 0 {
		return "off"
	}
	return fmt.Sprintf("%g/s", r)
}

// survivorCores is the cores each survivor used, "A 0.52, B 0.48".
func survivorCores(m map[string]float64) string {
	var out []string
	for _, id := range []string{"A", "B", "C"} {
		if v, ok := m[id]; ok {
			out = append(out, fmt.Sprintf("%s %.2f", id, v))
		}
	}
	return strings.Join(out, ", ")
}
