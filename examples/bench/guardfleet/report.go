package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/kds-host/kds-host/examples/bench/internal/procstat"
)

// report gathers every run's figures, their medians and each server's ratios to stock over the
// same cache in the same scenario.
type report struct {
	Machine procstat.Machine `json:"machine"`
	Command string           `json:"command"`
	Options optsJSON         `json:"options"`
	Results []*result        `json:"results"`
	Skipped []string         `json:"skipped,omitempty"`
	byJob   map[job]*result
}

type optsJSON struct {
	Runs           int    `json:"runs"`
	Clusters       int    `json:"clusters"`
	Updates        int    `json:"updates"`
	Warmup         int    `json:"warmup"`
	Idle           string `json:"idle"`
	StreamsPerConn int    `json:"streams_per_conn"`
	FixedWindows   bool   `json:"fixed_windows"`
	Pinned         bool   `json:"pinned"` // -pin: the server on core 0, the fleet on core 1
	Lean           bool   `json:"lean"`   // -lean: the fleet's SotW streams read responses without unmarshalling their resources
}

// result is one server over one cache in one scenario: the medians of its runs, its ratios to
// stock's medians, and every run.
type result struct {
	Scenario string    `json:"scenario"`
	Cache    string    `json:"cache"`
	Server   string    `json:"server"`
	Streams  int       `json:"streams"`
	Median   figures   `json:"median"`
	VsStock  ratios    `json:"vs_stock"`
	Runs     []figures `json:"runs"`
	job      job       // its key
	order    [3]int    // for sorting: scenario, cache, server
	stock    *result   // stock's result over the same cache and scenario (nil when it did not run)
}

// ratios are a server's medians over stock's (1 for stock itself, 0 where stock has none).
type ratios struct {
	Rate      float64 `json:"resources_per_s"`
	SyncCPU   float64 `json:"sync_cpu"`
	PeakRSS   float64 `json:"peak_rss"`
	LiveHeap  float64 `json:"live_heap"`
	FirstP50  float64 `json:"first_p50"`
	LastP50   float64 `json:"last_p50"`
	WriteLast float64 `json:"write_last_p50"`
	UpdateCPU float64 `json:"update_cpu"`
}

func newReport(o options) *report {
	r := &report{Command: o.command, byJob: map[job]*result{},
		Options: optsJSON{Runs: o.runs, Clusters: o.clusters, Updates: o.updates, Warmup: o.warmup, Idle: o.idle.String(),
			StreamsPerConn: o.streamsPerConn, FixedWindows: o.fixedWindows, Pinned: o.pin, Lean: o.lean}}
	r.Machine = procstat.NewMachine()
	for si, sc := range o.scenarios {
		for ci, c := range o.caches {
			for vi, sv := range allServers {
				j := job{sc, c, sv}
				res := &result{Scenario: sc.String(), Cache: c, Server: sv, Streams: sc.Streams, job: j, order: [3]int{si, ci, vi}}
				r.byJob[j] = res
				r.Results = append(r.Results, res)
			}
		}
	}
	return r
}

func (r *report) add(j job, f figures) { r.byJob[j].Runs = append(r.byJob[j].Runs, f) }

func (r *report) skip(j job, why string) {
	r.Skipped = append(r.Skipped, fmt.Sprintf("%s, %s, %s: %s", j.sc, j.cache, j.server, why))
}

// finish computes the medians and the ratios, and leaves out what never ran.
func (r *report) finish() {
	r.Machine.Finish()
	r.Results = slices.DeleteFunc(r.Results, func(res *result) bool { return len(res.Runs) == 0 })
	for _, res := range r.Results {
		res.Median = medianOf(res.Runs)
	}
	for _, res := range r.Results {
		if s := r.byJob[job{res.job.sc, res.job.cache, stock}]; len(s.Runs) > 0 {
			res.stock = s
			res.VsStock = ratiosOf(res.Median, s.Median)
		}
	}
}

// medianOf is the median of each figure over runs (the per-update lists are the first run's).
func medianOf(runs []figures) figures {
	m := runs[0]
	med := func(get func(figures) float64) float64 {
		v := make([]float64, len(runs))
		for i, f := range runs {
			v[i] = get(f)
		}
		slices.Sort(v)
		return procstat.Median(v)
	}
	m.Sync = med(func(f figures) float64 { return f.Sync })
	m.Rate = med(func(f figures) float64 { return f.Rate })
	m.SyncCPU = med(func(f figures) float64 { return f.SyncCPU })
	m.PeakRSS = uint64(med(func(f figures) float64 { return float64(f.PeakRSS) }))
	m.LiveHeap = uint64(med(func(f figures) float64 { return float64(f.LiveHeap) }))
	m.HeapInuse = uint64(med(func(f figures) float64 { return float64(f.HeapInuse) }))
	m.FirstP50 = med(func(f figures) float64 { return f.FirstP50 })
	m.LastP50 = med(func(f figures) float64 { return f.LastP50 })
	m.WriteFirst = med(func(f figures) float64 { return f.WriteFirst })
	m.WriteLast = med(func(f figures) float64 { return f.WriteLast })
	m.Applied = med(func(f figures) float64 { return f.Applied })
	m.UpdateCPU = med(func(f figures) float64 { return f.UpdateCPU })
	m.IdleCPU = med(func(f figures) float64 { return f.IdleCPU })
	return m
}

// ratiosOf are of's medians over stock's.
func ratiosOf(of, st figures) ratios {
	div := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	return ratios{Rate: div(of.Rate, st.Rate), SyncCPU: div(of.SyncCPU, st.SyncCPU), PeakRSS: div(float64(of.PeakRSS), float64(st.PeakRSS)),
		LiveHeap: div(float64(of.LiveHeap), float64(st.LiveHeap)), FirstP50: div(of.FirstP50, st.FirstP50), LastP50: div(of.LastP50, st.LastP50),
		WriteLast: div(of.WriteLast, st.WriteLast), UpdateCPU: div(of.UpdateCPU, st.UpdateCPU)}
}

// cpuPerUpdateStream is the server's CPU per update per stream, in µs.
func (f figures) cpuPerUpdateStream(streams int) float64 {
	if streams == 0 {
		return 0
	}
	return f.UpdateCPU * 1e6 / float64(streams)
}

// withRatio is a figure and, for a server other than stock, its ratio to stock's in brackets.
func withRatio(res *result, v string, ratio float64) string {
	if res.Server == stock || res.stock == nil {
		return v
	}
	return fmt.Sprintf("%s (%.2f)", v, ratio)
}

func (r *report) print(w io.Writer) {
	runs := "one run"
	if r.Options.Runs > 1 {
		runs = fmt.Sprintf("medians of %d interleaved runs", r.Options.Runs)
	}
	windows := "grpc-go's default windows"
	if r.Options.FixedWindows {
		windows = "fixed windows"
	}
	if r.Options.Pinned {
		windows += "; the server on core 0, the fleet on core 1 (-pin)"
	}
	if r.Options.Lean {
		windows += "; SotW responses read lean (-lean)"
	}
	fmt.Fprintf(w, "guardfleet at %s: %s, %d clusters, %d updates (+%d warm-up), %d streams a connection, %s\n%s\n",
		r.Machine.Commit, runs, r.Options.Clusters, r.Options.Updates, r.Options.Warmup, r.Options.StreamsPerConn, windows, r.Machine.Description)
	fmt.Fprintln(w, "(x.xx) = the ratio to stock over the same cache in the same run; latencies are p50s over the updates")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tcache\tserver\tsync res/s\tsync CPU\tpeak RSS\tlive heap\tgiven->first\tgiven->last\trename->given\trename->first\trename->last\tCPU/update/stream\tidle CPU\t")
	res := slices.Clone(r.Results)
	slices.SortStableFunc(res, func(a, b *result) int { return slices.Compare(a.order[:], b.order[:]) })
	for _, x := range res {
		m := x.Median
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", x.Scenario, x.Cache, x.Server,
			withRatio(x, fmt.Sprintf("%.0f k/s", m.Rate/1000), x.VsStock.Rate),
			withRatio(x, fmt.Sprintf("%.2f s", m.SyncCPU), x.VsStock.SyncCPU),
			withRatio(x, mib(m.PeakRSS), x.VsStock.PeakRSS),
			withRatio(x, mib(m.LiveHeap), x.VsStock.LiveHeap),
			withRatio(x, fmt.Sprintf("%.1f ms", m.FirstP50), x.VsStock.FirstP50),
			withRatio(x, fmt.Sprintf("%.1f ms", m.LastP50), x.VsStock.LastP50),
			fmt.Sprintf("%.1f ms", m.Applied),
			fmt.Sprintf("%.1f ms", m.WriteFirst),
			withRatio(x, fmt.Sprintf("%.1f ms", m.WriteLast), x.VsStock.WriteLast),
			withRatio(x, fmt.Sprintf("%.1f us", m.cpuPerUpdateStream(x.Streams)), x.VsStock.UpdateCPU),
			fmt.Sprintf("%.2f %%", m.IdleCPU))
	}
	tw.Flush()
	for _, s := range r.Skipped {
		fmt.Fprintln(w, "skipped:", s)
	}
}

// write writes guardfleet.txt (the table) and guardfleet.json (everything) into dir.
func (r *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var txt strings.Builder
	fmt.Fprintf(&txt, "%s\n\n", r.Command)
	r.print(&txt)
	if err := os.WriteFile(filepath.Join(dir, "guardfleet.txt"), []byte(txt.String()), 0o644); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "guardfleet.json"), append(b, '\n'), 0o644)
}
