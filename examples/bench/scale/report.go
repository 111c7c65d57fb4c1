package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"text/tabwriter"

	"github.com/kds-host/kds-host/examples/bench/internal/procstat"
)

// report gathers every run's figures, their medians, the ratios between servers and the
// verdicts of the "Must hold" lines (issue 24's against stock, issue 14's holds-on against
// holds-off).
type report struct {
	Machine  procstat.Machine `json:"machine"`
	Command  string           `json:"command"`
	Options  reportOptions    `json:"options"`
	Results  []*result        `json:"results"`
	Ratios   []ratio          `json:"ratios"`
	Verdicts []verdict        `json:"verdicts"`
	Skipped  []skipped        `json:"skipped,omitempty"`
	order    []scenario       // scenarios in the order asked
	byKey    map[key]*result  // the same results
}

type key struct {
	sc scenario
	sv server
}

type reportOptions struct {
	Runs           int    `json:"runs"`
	Updates        int    `json:"updates"`
	Warmup         int    `json:"warmup"`
	Gap            string `json:"gap"`
	Idle           string `json:"idle"`
	StreamsPerConn int    `json:"streams_per_conn"`
	DefaultWindows bool   `json:"default_windows,omitempty"`
}

// result is one server in one scenario: the medians of its runs, and every run.
type result struct {
	Zones     int       `json:"zones"`
	Resources int       `json:"resources"`
	Server    server    `json:"server"`
	Median    figures   `json:"median"`
	Runs      []figures `json:"runs"`
}

// ratio is a figure of one server over the same figure of another, in one scenario.
type ratio struct {
	Scenario string  `json:"scenario"`
	Figure   string  `json:"figure"`
	Of       server  `json:"of"`
	Over     server  `json:"over"`
	Value    float64 `json:"value"`
}

// verdict is one "Must hold" line.
type verdict struct {
	Scenario string  `json:"scenario"`
	Rule     string  `json:"rule"`
	Value    float64 `json:"value"`
	Met      bool    `json:"met"`
}

type skipped struct {
	Scenario string `json:"scenario"`
	Server   server `json:"server"`
	Reason   string `json:"reason"`
}

func newReport(o options) *report {
	r := &report{
		Command: o.command,
		Options: reportOptions{Runs: o.runs, Updates: o.updates, Warmup: o.warmup, Gap: o.gap.String(), Idle: o.idle.String(), StreamsPerConn: o.streamsPerConn, DefaultWindows: o.defaultWindows},
		order:   o.scenarios,
		byKey:   map[key]*result{},
	}
	r.Machine = procstat.NewMachine()
	return r
}

func (r *report) skip(sc scenario, sv server, reason string) {
	r.Skipped = append(r.Skipped, skipped{Scenario: sc.String(), Server: sv, Reason: reason})
	delete(r.byKey, key{sc, sv})
	r.Results = slices.DeleteFunc(r.Results, func(x *result) bool { return x.Zones == sc.Zones && x.Resources == sc.Resources && x.Server == sv })
}

func (r *report) add(sc scenario, sv server, f figures) {
	k := key{sc, sv}
	res := r.byKey[k]
	if res == nil {
		res = &result{Zones: sc.Zones, Resources: sc.Resources, Server: sv}
		r.byKey[k] = res
		r.Results = append(r.Results, res)
	}
	res.Runs = append(res.Runs, f)
}

// finish notes the end of the runs, and derives.
func (r *report) finish() {
	r.Machine.Finish()
	r.derive()
}

// derive computes the medians, ratios and verdicts from the runs.
func (r *report) derive() {
	r.Ratios, r.Verdicts = nil, nil
	slices.SortStableFunc(r.Results, func(a, b *result) int {
		return r.scenarioIndex(scenario{a.Zones, a.Resources}) - r.scenarioIndex(scenario{b.Zones, b.Resources})
	})
	for _, res := range r.Results {
		res.Median = medianOf(res.Runs)
	}
	for _, sc := range r.order {
		on, off, st := r.byKey[key{sc, holdsOn}], r.byKey[key{sc, holdsOff}], r.byKey[key{sc, stock}]
		g, ss, gs := r.byKey[key{sc, guarded}], r.byKey[key{sc, stockSotW}], r.byKey[key{sc, guardSotW}]
		fl, na := r.byKey[key{sc, floorOnly}], r.byKey[key{sc, noAuth}]
		for _, pair := range [][2]*result{{on, st}, {on, off}, {off, st}, {g, st}, {gs, ss}, {ss, st}, {on, fl}, {st, fl}, {na, st}} {
			a, b := pair[0], pair[1]
			if a == nil || b == nil {
				continue
			}
			for _, f := range ratioFigures {
				r.Ratios = append(r.Ratios, ratio{Scenario: sc.String(), Figure: f.name, Of: a.Server, Over: b.Server, Value: f.of(a.Median) / f.of(b.Median)})
			}
		}
		add := func(rule string, v float64, met bool) {
			r.Verdicts = append(r.Verdicts, verdict{Scenario: sc.String(), Rule: rule, Value: v, Met: met})
		}
		// Issue 24's bar, at every scenario: it supersedes issues 14 and 21's against stock.
		if on != nil && st != nil {
			m, s := on.Median, st.Median
			add("full sync resources/s, holds-on / stock >= 1.5", m.Rate/s.Rate, m.Rate/s.Rate >= 1.5)
			// The zones' process is on the same cores and takes about as much CPU as the server:
			// when the two saturate the machine the wall clock says little about the server, and
			// resources per second of its own CPU is the throughput it would have on cores of its
			// own (the same resources for both: stock's CPU over kds-host's).
			add("full sync resources per server CPU second, holds-on / stock >= 1.5", s.SyncCPU/m.SyncCPU, s.SyncCPU/m.SyncCPU >= 1.5)
			add("full sync server CPU, holds-on / stock <= 1.0", m.SyncCPU/s.SyncCPU, m.SyncCPU <= s.SyncCPU)
			add("live heap after GC, holds-on / stock <= 1.0", float64(m.LiveHeap)/float64(s.LiveHeap), m.LiveHeap <= s.LiveHeap)
			add("peak RSS, holds-on / stock <= 1.1", float64(m.PeakRSS)/float64(s.PeakRSS), float64(m.PeakRSS)/float64(s.PeakRSS) <= 1.1)
			add("update p50, holds-on / stock <= 0.5", m.UpdateP50/s.UpdateP50, m.UpdateP50/s.UpdateP50 <= 0.5)
		}
		// Issue 14's: what the owner holds may cost.
		if on != nil && off != nil {
			m, f := on.Median, off.Median
			add("update p50, holds-on / holds-off <= 1.5", m.UpdateP50/f.UpdateP50, m.UpdateP50/f.UpdateP50 <= 1.5)
			add("server CPU per update, holds-on / holds-off <= 2", m.UpdateCPU/f.UpdateCPU, m.UpdateCPU/f.UpdateCPU <= 2)
		}
		if on != nil && sc == (scenario{10000, 1000}) {
			v := on.Median.cpuPerStreamWrite(sc.Zones)
			add("server CPU per stream per write, holds-on, us <= 20", v, v <= 20)
		}
		if on != nil && sc.Zones >= 1000 {
			add("idle server CPU, holds-on, % of one core < 1", on.Median.IdleCPU, on.Median.IdleCPU < 1)
		}
	}
}

func (r *report) scenarioIndex(sc scenario) int {
	if i := slices.Index(r.order, sc); i >= 0 {
		return i
	}
	return len(r.order)
}

func (r *report) allMet() bool {
	for _, v := range r.Verdicts {
		if !v.Met {
			return false
		}
	}
	return true
}

type ratioFigure struct {
	name string
	of   func(figures) float64
}

var ratioFigures = []ratioFigure{
	{"resources/s", func(f figures) float64 { return f.Rate }},
	{"sync CPU", func(f figures) float64 { return f.SyncCPU }},
	{"update p50", func(f figures) float64 { return f.UpdateP50 }},
	{"update max", func(f figures) float64 { return f.UpdateMax }},
	{"CPU/update", func(f figures) float64 { return f.UpdateCPU }},
	{"peak RSS", func(f figures) float64 { return float64(f.PeakRSS) }},
	{"live heap", func(f figures) float64 { return float64(f.LiveHeap) }},
}

// medianOf is the median of each figure over runs.
func medianOf(runs []figures) figures {
	m := func(get func(figures) float64) float64 {
		v := make([]float64, len(runs))
		for i, f := range runs {
			v[i] = get(f)
		}
		slices.Sort(v)
		return procstat.Median(v)
	}
	return figures{
		Ready:      m(func(f figures) float64 { return f.Ready }),
		Sync:       m(func(f figures) float64 { return f.Sync }),
		Rate:       m(func(f figures) float64 { return f.Rate }),
		SyncCPU:    m(func(f figures) float64 { return f.SyncCPU }),
		SyncFaults: m(func(f figures) float64 { return f.SyncFaults }),
		ZonesCPU:   m(func(f figures) float64 { return f.ZonesCPU }),
		UpdateP50:  m(func(f figures) float64 { return f.UpdateP50 }),
		UpdateMax:  m(func(f figures) float64 { return f.UpdateMax }),
		UpdateCPU:  m(func(f figures) float64 { return f.UpdateCPU }),
		UpdateIO:   m(func(f figures) float64 { return f.UpdateIO }),
		IdleCPU:    m(func(f figures) float64 { return f.IdleCPU }),
		PeakRSS:    uint64(m(func(f figures) float64 { return float64(f.PeakRSS) })),
		LiveHeap:   uint64(m(func(f figures) float64 { return float64(f.LiveHeap) })),
		BaseHeap:   uint64(m(func(f figures) float64 { return float64(f.BaseHeap) })),
		StreamsPer: runs[0].StreamsPer,
	}
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "\n%s\n", r.Machine.Description)
	runs := "1 run"
	if r.Options.Runs > 1 {
		runs = fmt.Sprintf("medians of %d runs", r.Options.Runs)
	}
	windows := "the zones' fixed windows"
	if r.Options.DefaultWindows {
		windows = "grpc-go's default windows"
	}
	fmt.Fprintf(w, "%s; %d updates measured per run after %d unmeasured; idle measured over %s; %s\n\n", runs, r.Options.Updates, r.Options.Warmup, r.Options.Idle, windows)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "zones\tresources\tstreams/conn\tserver\tfull sync\tresources/s\tsync CPU\tsync faults\tzones CPU\tcores busy\tupdate p50\tupdate max\tCPU/update\tCPU/stream/write\tsyscalls/stream/write\tidle CPU\tpeak RSS\tlive heap\theap/stream\t\n")
	for _, res := range r.Results {
		f := res.Median
		faults := "-" // a result from before the bench counted them
		if f.SyncFaults > 0 {
			faults = fmt.Sprintf("%.0f k", f.SyncFaults/1000)
		}
		syscalls := "-" // likewise
		if f.UpdateIO > 0 && res.Zones > 0 {
			syscalls = fmt.Sprintf("%.2f", f.UpdateIO/float64(res.Zones))
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%.2f s\t%.0f k/s\t%.2f s\t%s\t%.2f s\t%.2f\t%.1f ms\t%.1f ms\t%.3f s\t%.1f us\t%s\t%.2f %%\t%s\t%s\t%s\t\n",
			res.Zones, res.Resources, f.StreamsPer, res.Server, f.Sync, f.Rate/1000, f.SyncCPU, faults, f.ZonesCPU, (f.SyncCPU+f.ZonesCPU)/f.Sync, f.UpdateP50, f.UpdateMax, f.UpdateCPU,
			f.cpuPerStreamWrite(res.Zones), syscalls, f.IdleCPU, mib(f.PeakRSS), mib(f.LiveHeap), kib(f.heapPerStream(res.Zones)))
	}
	tw.Flush()

	if len(r.Ratios) > 0 {
		fmt.Fprintf(w, "\nratios (medians)\n")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "scenario\tratio\t")
		for _, f := range ratioFigures {
			fmt.Fprintf(tw, "%s\t", f.name)
		}
		fmt.Fprintf(tw, "\n")
		for i := 0; i < len(r.Ratios); i += len(ratioFigures) {
			row := r.Ratios[i : i+len(ratioFigures)]
			fmt.Fprintf(tw, "%s\t%s / %s\t", row[0].Scenario, row[0].Of, row[0].Over)
			for _, x := range row {
				fmt.Fprintf(tw, "%.2f\t", x.Value)
			}
			fmt.Fprintf(tw, "\n")
		}
		tw.Flush()
	}
	if len(r.Verdicts) > 0 {
		fmt.Fprintf(w, "\nmust hold (issue 24 against stock, issue 14 holds-on against holds-off)\n")
		for _, v := range r.Verdicts {
			mark := "ok"
			if !v.Met {
				mark = "NOT MET"
			}
			fmt.Fprintf(w, "  %-10s %-72s %8.2f  %s\n", v.Scenario, v.Rule, v.Value, mark)
		}
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "\nskipped %s, %s: %s", s.Scenario, s.Server, s.Reason)
	}
	if len(r.Skipped) > 0 {
		fmt.Fprintln(w)
	}
}

// write puts scale.json, latency.svg and cpu.svg into dir.
func (r *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "scale.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	cmd := r.Command
	if len(cmd) > 140 {
		cmd = cmd[:137] + "..."
	}
	sub := []string{r.Machine.Description, fmt.Sprintf("%s (commit %s, %s)", cmd, r.Machine.Commit, r.Machine.Started)}
	plots := []struct {
		file, title, unit string
		get               func(figures) float64
	}{
		{"latency.svg", "One update reaching every zone: p50", "ms", func(f figures) float64 { return f.UpdateP50 }},
		{"cpu.svg", "Server CPU per update", "s", func(f figures) float64 { return f.UpdateCPU }},
	}
	for _, p := range plots {
		if err := os.WriteFile(filepath.Join(dir, p.file), []byte(r.plot(p.title, sub, p.unit, p.get)), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// replotFile reads a report written by write (or several merged by hand: their "results"
// concatenated), derives its medians, ratios and verdicts again, prints it and writes it into dir.
func replotFile(file, dir string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	r := &report{byKey: map[key]*result{}}
	if err := json.Unmarshal(b, r); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	for _, res := range r.Results {
		sc := scenario{res.Zones, res.Resources}
		if !slices.Contains(r.order, sc) {
			r.order = append(r.order, sc)
		}
		r.byKey[key{sc, res.Server}] = res
	}
	r.derive()
	r.print(os.Stdout)
	if dir == "" {
		return nil
	}
	return r.write(dir)
}
