package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kds-host/kds-host/examples/bench/internal/procstat"
)

// figures is what one run of one server over one cache in one scenario measured.
type figures struct {
	Sync       float64 `json:"full_sync_s"`     // first dial until every stream holds every cluster
	Rate       float64 `json:"resources_per_s"` // streams x clusters / Sync
	SyncCPU    float64 `json:"sync_cpu_s"`      // server CPU from the fleet's start until synced
	PeakRSS    uint64  `json:"peak_rss_bytes"`  // VmHWM at the end of the run
	LiveHeap   uint64  `json:"live_heap_bytes"` // go_gc_heap_live_bytes at the end: the heap the last GC found live
	HeapInuse  uint64  `json:"heap_inuse_bytes"`
	FirstP50   float64 `json:"first_p50_ms"`       // the server given the change -> the first stream has it
	LastP50    float64 `json:"last_p50_ms"`        // ... -> the last stream has it
	WriteFirst float64 `json:"write_first_p50_ms"` // the file renamed into place -> the first stream
	WriteLast  float64 `json:"write_last_p50_ms"`  // ... -> the last stream
	Applied    float64 `json:"applied_p50_ms"`     // the file renamed -> the server gives its cache the change
	UpdateCPU  float64 `json:"update_cpu_s"`       // server CPU per update
	FleetCPU   float64 `json:"fleet_update_cpu_s"` // the fleet's CPU per update (its decoding of what it gets)
	IdleCPU    float64 `json:"idle_cpu_pct"`       // % of one core, every stream open, nothing changing
	// Per update, in order: milliseconds from the change given to the server to the first and
	// the last stream, and from the rename.
	First          []float64 `json:"first_ms"`
	Last           []float64 `json:"last_ms"`
	FromWriteFirst []float64 `json:"write_first_ms"`
	FromWriteLast  []float64 `json:"write_last_ms"`
}

func (f figures) summary() string {
	return fmt.Sprintf("sync %.2f s (%.0f k/s, CPU %.2f s), first/last p50 %.1f/%.1f ms (from the rename %.1f/%.1f), CPU/update %.3f s (fleet %.3f s), idle %.2f %%, VmHWM %s, live heap %s",
		f.Sync, f.Rate/1000, f.SyncCPU, f.FirstP50, f.LastP50, f.WriteFirst, f.WriteLast, f.UpdateCPU, f.FleetCPU, f.IdleCPU, mib(f.PeakRSS), mib(f.LiveHeap))
}

// The cores -pin gives the server and the fleet.
const serverCore, fleetCore = "0", "1"

// start starts a child, on its core with -pin (taskset execs it: the child's pid is its own).
func (o options) start(name, core, path string, args ...string) (*procstat.Child, error) {
	if o.pin {
		return procstat.StartChild(name, "taskset", append([]string{"-c", core, path}, args...)...)
	}
	return procstat.StartChild(name, path, args...)
}

// fleetCPU is the fleet's CPU so far (0 if it cannot be read: the figure is then left out).
func fleetCPU(fleet *procstat.Child) time.Duration {
	d, _ := procstat.CPUOf(fleet.Pid())
	return d
}

func mib(b uint64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// freeAddr is a loopback address free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// measure runs one job and stops everything it started, whatever happens.
func measure(ctx context.Context, o options, self, xdsServer string, j job) (fig figures, err error) {
	tmp, err := os.MkdirTemp("", "kds-bench-guardfleet-")
	if err != nil {
		return fig, err
	}
	defer os.RemoveAll(tmp)
	file := filepath.Join(tmp, "resources.json")
	if _, err := writeResources(file, o.clusters, -1); err != nil {
		return fig, err
	}
	xdsAddr, err := freeAddr()
	if err != nil {
		return fig, err
	}
	adminAddr, err := freeAddr()
	if err != nil {
		return fig, err
	}
	var srv *procstat.Child
	if j.server == stock {
		srv, err = o.start(j.server, serverCore, self, "-stock", j.cache, "-stock-resources", file, "-stock-xds-addr", xdsAddr, "-stock-admin-addr", adminAddr)
	} else {
		srv, err = o.start(j.server, serverCore, xdsServer, "--resources", file, "--cache", j.cache, "--guard="+strconv.FormatBool(j.server == guardOn),
			"--xds-addr", xdsAddr, "--admin-addr", adminAddr, "--log-level", "warn", "--resources-reread", "0")
	}
	if err != nil {
		return fig, err
	}
	defer func() {
		_ = srv.Signal(syscall.SIGTERM) // xds-server stops on it; the stock server on its standard input closing
		if serr := srv.Stop(time.Minute); serr != nil && err == nil {
			err = serr
		}
	}()
	admin := "http://" + adminAddr
	if err := waitReady(ctx, admin+"/readyz", 30*time.Second); err != nil {
		return fig, fmt.Errorf("%s: %w", j.server, err)
	}
	pid := srv.Pid()
	var cpuErr error
	cpu := func() time.Duration {
		d, err := procstat.CPUOf(pid)
		if err != nil && cpuErr == nil {
			cpuErr = err
		}
		return d
	}
	defer func() {
		if cpuErr != nil && err == nil {
			err = cpuErr
		}
	}()
	procstat.Quiet(ctx, pid, 10*time.Second)

	// Full sync.
	total := o.warmup + o.updates
	cpu0 := cpu()
	fleet, err := o.start("fleet", fleetCore, self, "-fleet", xdsAddr, "-fleet-streams", strconv.Itoa(j.sc.Streams),
		"-fleet-streams-per-conn", strconv.Itoa(o.streamsPerConn), "-fleet-clusters", strconv.Itoa(o.clusters),
		"-fleet-updates", strconv.Itoa(total), "-fleet-delta="+strconv.FormatBool(j.sc.Delta), "-fleet-fixed-windows="+strconv.FormatBool(o.fixedWindows),
		"-fleet-lean="+strconv.FormatBool(o.lean))
	if err != nil {
		return fig, err
	}
	defer func() {
		if ferr := fleet.Stop(time.Minute); ferr != nil && err == nil {
			err = ferr
		}
	}()
	line, err := fleet.Expect(ctx, "synced ", o.syncTimeout)
	if err != nil {
		if p := fleet.LastLine("progress "); p != "" {
			err = fmt.Errorf("%w (%s of %d streams held every cluster)", err, strings.TrimPrefix(p, "progress "), j.sc.Streams)
		}
		return fig, fmt.Errorf("full sync: %w", err)
	}
	fig.SyncCPU = (cpu() - cpu0).Seconds()
	ns, err := strconv.ParseInt(strings.TrimPrefix(line, "synced "), 10, 64)
	if err != nil {
		return fig, fmt.Errorf("fleet: %q: %w", line, err)
	}
	fig.Sync = time.Duration(ns).Seconds()
	fig.Rate = float64(j.sc.Streams) * float64(o.clusters) / fig.Sync
	procstat.Quiet(ctx, pid, 30*time.Second) // the last ACKs

	// Updates: one cluster each, renamed into place; the latencies count from the moment the
	// server says it gave its cache the change, and from the rename.
	client := &http.Client{Timeout: 10 * time.Second}
	var cpuA, fleetA time.Duration
	var applied []float64
	for seq := range total {
		if seq == o.warmup {
			cpuA, fleetA = cpu(), fleetCPU(fleet)
		}
		wrote, err := writeResources(file, o.clusters, seq)
		if err != nil {
			return fig, err
		}
		line, err := fleet.Expect(ctx, fmt.Sprintf("got %d ", seq), o.updateTimeout)
		if err != nil {
			return fig, fmt.Errorf("update %d: %w", seq, err)
		}
		var got, first, last int64
		if _, err := fmt.Sscanf(line, "got %d %d %d", &got, &first, &last); err != nil {
			return fig, fmt.Errorf("fleet: %q: %w", line, err)
		}
		m, err := scrape(client, admin+"/metrics")
		if err != nil {
			return fig, fmt.Errorf("update %d: %w", seq, err)
		}
		given := int64(m["kds_xds_resources_file_loaded_timestamp_seconds"] * 1e9)
		if given < wrote.Add(-time.Millisecond).UnixNano() || given > last {
			return fig, fmt.Errorf("update %d: the server says it gave its cache a change at %s, not between the rename (%s) and the last stream's (%s)",
				seq, time.Unix(0, given).Format(time.StampMicro), wrote.Format(time.StampMicro), time.Unix(0, last).Format(time.StampMicro))
		}
		if seq >= o.warmup {
			fig.First = append(fig.First, float64(first-given)/1e6)
			fig.Last = append(fig.Last, float64(last-given)/1e6)
			fig.FromWriteFirst = append(fig.FromWriteFirst, float64(first-wrote.UnixNano())/1e6)
			fig.FromWriteLast = append(fig.FromWriteLast, float64(last-wrote.UnixNano())/1e6)
			applied = append(applied, float64(given-wrote.UnixNano())/1e6)
		}
		procstat.Quiet(ctx, pid, 10*time.Second) // the update's ACKs, before the next
	}
	fig.UpdateCPU = (cpu() - cpuA).Seconds() / float64(o.updates)
	fig.FleetCPU = (fleetCPU(fleet) - fleetA).Seconds() / float64(o.updates)
	p50 := func(v []float64) float64 { return procstat.Median(slices.Sorted(slices.Values(v))) }
	fig.FirstP50, fig.LastP50, fig.WriteFirst, fig.WriteLast, fig.Applied = p50(fig.First), p50(fig.Last), p50(fig.FromWriteFirst), p50(fig.FromWriteLast), p50(applied)

	// Idle, every stream open.
	i0, t0 := cpu(), time.Now()
	procstat.Sleep(ctx, o.idle)
	fig.IdleCPU = 100 * (cpu() - i0).Seconds() / time.Since(t0).Seconds()
	if ctx.Err() != nil {
		return fig, ctx.Err()
	}

	// Memory.
	m, err := scrape(client, admin+"/metrics")
	if err != nil {
		return fig, err
	}
	fig.LiveHeap, fig.HeapInuse = uint64(m["go_gc_heap_live_bytes"]), uint64(m["go_memstats_heap_inuse_bytes"])
	if _, fig.PeakRSS, err = procstat.MemOf(pid); err != nil {
		return fig, err
	}
	return fig, nil
}

// waitReady polls url until it answers 200, at most timeout.
func waitReady(ctx context.Context, url string, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for {
		if resp, err := client.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer 200 within %s", url, timeout)
		}
		procstat.Sleep(ctx, 50*time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// scrape reads the unlabelled series of a Prometheus text page.
func scrape(client *http.Client, url string) (map[string]float64, error) {
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
			out[name] = f
		}
	}
	return out, sc.Err()
}
