package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kds-host/kds-host/examples/bench/internal/benchproc"
	"github.com/kds-host/kds-host/examples/bench/internal/procstat"
)

// figures is what one run of one server in one scenario measured.
type figures struct {
	Ready      float64   `json:"ready_s"`           // server start (store fill included) until it serves
	Sync       float64   `json:"full_sync_s"`       // first zone dial until every zone holds everything
	Rate       float64   `json:"resources_per_s"`   // zones x (resources + 1) / Sync
	SyncCPU    float64   `json:"sync_cpu_s"`        // server CPU from the zones' start until synced
	SyncFaults float64   `json:"sync_minor_faults"` // the server's page faults over the same span (minflt)
	ZonesCPU   float64   `json:"zones_sync_cpu_s"`  // the zones' process's CPU over the same span
	UpdateP50  float64   `json:"update_p50_ms"`     // one update reaching every zone
	UpdateMax  float64   `json:"update_max_ms"`
	UpdateCPU  float64   `json:"update_cpu_s"`    // server CPU per update
	UpdateIO   float64   `json:"update_syscalls"` // the server's read and write system calls per update (/proc/PID/io)
	IdleCPU    float64   `json:"idle_cpu_pct"`    // % of one core, every zone connected, nothing changing
	PeakRSS    uint64    `json:"peak_rss_bytes"`  // VmHWM at the end of the run
	LiveHeap   uint64    `json:"live_heap_bytes"` // HeapAlloc after two forced GCs, at the end
	BaseHeap   uint64    `json:"base_heap_bytes"` // the same before the first zone dialed
	StreamsPer int       `json:"streams_per_conn"`
	Updates    []float64 `json:"updates_ms"`
	CPUProfile string    `json:"cpu_profile,omitempty"`
}

func (f figures) summary() string {
	return fmt.Sprintf("sync %.2f s (%.0f k/s, CPU %.2f s, %.0f k page faults), update p50 %.1f ms max %.1f ms CPU %.3f s, idle %.2f %%, VmHWM %s, heap %s",
		f.Sync, f.Rate/1000, f.SyncCPU, f.SyncFaults/1000, f.UpdateP50, f.UpdateMax, f.UpdateCPU, f.IdleCPU, mib(f.PeakRSS), mib(f.LiveHeap))
}

func mib(b uint64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

func kib(b float64) string { return fmt.Sprintf("%.1f KiB", b/(1<<10)) }

// measure runs one server in one scenario, and stops everything it started, whatever happens.
func measure(ctx context.Context, o options, self, bin string, sc scenario, sv server, prof string) (fig figures, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	tmp, err := os.MkdirTemp(o.tmp, "kds-bench-scale-")
	if err != nil {
		return fig, err
	}
	defer os.RemoveAll(tmp)

	var path string
	var args []string
	tokens := ""
	switch sv {
	case holdsOn, holdsOff:
		tokens = filepath.Join(tmp, "tokens")
		path = filepath.Join(bin, "benchserver")
		args = []string{"-resources", strconv.Itoa(sc.Resources), "-zones", strconv.Itoa(sc.Zones), "-tokens", tokens,
			"-owner-holds=" + strconv.FormatBool(sv == holdsOn), "-tmp", tmp}
	case noAuth:
		path = filepath.Join(bin, "benchserver")
		args = []string{"-resources", strconv.Itoa(sc.Resources), "-kds-auth=false", "-tmp", tmp}
	default:
		path = filepath.Join(bin, "stock")
		args = []string{"-resources", strconv.Itoa(sc.Resources)}
		switch sv {
		case guarded, guardSotW:
			args = append(args, "-guard")
		case floorOnly:
			args = append(args, "-floor")
		}
	}
	if prof != "" {
		base := strings.TrimSuffix(prof, ".pprof")
		args = append(args, "-cpuprofile", prof, "-cpuprofile-after-sync", base+".after.pprof", "-heapprofile", base+".heap.pprof")
		fig.CPUProfile = prof
	}
	started := time.Now()
	srv, err := procstat.StartChild(string(sv), path, args...)
	if err != nil {
		return fig, err
	}
	defer func() {
		if serr := srv.Stop(time.Minute); serr != nil && err == nil {
			err = serr
		}
	}()
	line, err := srv.Expect(ctx, "ready ", 10*time.Minute)
	if err != nil {
		return fig, err
	}
	fig.Ready = time.Since(started).Seconds()
	kdsAddr, control, err := benchproc.ParseReady(line)
	if err != nil {
		return fig, err
	}
	pid := srv.Pid()
	var cpuErr error // the first failure to read the server's CPU time
	defer func() {
		if cpuErr != nil && err == nil {
			err = cpuErr
		}
	}()
	cpu := func() time.Duration {
		d, err := procstat.CPUOf(pid)
		if err != nil && cpuErr == nil {
			cpuErr = err
		}
		return d
	}
	procstat.Quiet(ctx, pid, 10*time.Second)
	if fig.BaseHeap, err = liveHeap(control); err != nil {
		return fig, err
	}

	// Full sync.
	fig.StreamsPer = o.streamsPerConnFor(sc)
	total := o.warmup + o.updates
	fargs := []string{"-fleet", kdsAddr, "-fleet-zones", strconv.Itoa(sc.Zones), "-fleet-resources", strconv.Itoa(sc.Resources),
		"-fleet-updates", strconv.Itoa(total), "-fleet-streams-per-conn", strconv.Itoa(fig.StreamsPer), "-fleet-sotw=" + strconv.FormatBool(sv.sotw()),
		"-fleet-default-windows=" + strconv.FormatBool(o.defaultWindows)}
	if tokens != "" {
		fargs = append(fargs, "-fleet-tokens", tokens)
	}
	if prof != "" {
		fargs = append(fargs, "-fleet-cpuprofile", strings.TrimSuffix(prof, ".pprof")+".zones.pprof")
	}
	faults0, faultsErr := procstat.MinorFaultsOf(pid)
	cpu0 := cpu()
	zones, err := procstat.StartChild("zones", self, fargs...)
	if err != nil {
		return fig, err
	}
	defer func() {
		if zerr := zones.Stop(time.Minute); zerr != nil && err == nil {
			err = zerr
		}
	}()
	line, err = zones.Expect(ctx, "synced ", o.syncTimeout)
	if err != nil {
		if p := zones.LastLine("progress "); p != "" {
			var z, acked int64
			fmt.Sscanf(p, "progress %d %d", &z, &acked)
			err = fmt.Errorf("%w (%d of %d zones had ACKed everything, %d of %d resources delivered)", err, z, sc.Zones, acked, int64(sc.Zones)*int64(sc.Resources+1))
		}
		return fig, fmt.Errorf("full sync: %w", err)
	}
	cpu1 := cpu()
	if faults1, err := procstat.MinorFaultsOf(pid); err == nil && faultsErr == nil {
		fig.SyncFaults = float64(faults1 - faults0)
	}
	if zcpu, err := procstat.CPUOf(zones.Pid()); err == nil {
		fig.ZonesCPU = zcpu.Seconds()
	}
	ns, err := strconv.ParseInt(strings.TrimPrefix(line, "synced "), 10, 64)
	if err != nil {
		return fig, fmt.Errorf("zones: %q: %w", line, err)
	}
	fig.Sync = time.Duration(ns).Seconds()
	fig.Rate = float64(sc.Zones) * float64(sc.Resources+1) / fig.Sync
	fig.SyncCPU = (cpu1 - cpu0).Seconds()
	if prof != "" { // the sync's CPU profile ends here
		if err := post(&http.Client{Timeout: time.Minute}, "http://"+control+"/synced"); err != nil {
			return fig, fmt.Errorf("POST /synced: %w", err)
		}
	}
	procstat.Quiet(ctx, pid, 30*time.Second) // the last ACKs, and whatever the server does after a sync

	// Updates: each from just before the control request until the zones' process saw the last
	// zone hold it (both read the same wall clock).
	client := &http.Client{Timeout: o.updateTimeout}
	var cpuA time.Duration
	var ioA int64
	ioErr := errors.New("not read")
	for seq := range total {
		if seq == o.warmup {
			procstat.Quiet(ctx, pid, 10*time.Second)
			cpuA = cpu()
			ioA, ioErr = procstat.SyscallsOf(pid)
		}
		t0 := time.Now()
		if err := post(client, fmt.Sprintf("http://%s/update?seq=%d", control, seq)); err != nil {
			return fig, fmt.Errorf("update %d: %w", seq, err)
		}
		line, err := zones.Expect(ctx, fmt.Sprintf("reached %d ", seq), o.updateTimeout)
		if err != nil {
			return fig, fmt.Errorf("update %d: %w", seq, err)
		}
		at, err := strconv.ParseInt(line[strings.LastIndexByte(line, ' ')+1:], 10, 64)
		if err != nil {
			return fig, fmt.Errorf("zones: %q: %w", line, err)
		}
		if seq >= o.warmup {
			fig.Updates = append(fig.Updates, float64(at-t0.UnixNano())/1e6)
		}
		procstat.Sleep(ctx, o.gap)
	}
	procstat.Quiet(ctx, pid, 30*time.Second) // the last update's ACKs
	fig.UpdateCPU = (cpu() - cpuA).Seconds() / float64(o.updates)
	if ioB, err := procstat.SyscallsOf(pid); err == nil && ioErr == nil {
		fig.UpdateIO = float64(ioB-ioA) / float64(o.updates)
	}
	sorted := slices.Sorted(slices.Values(fig.Updates))
	fig.UpdateP50, fig.UpdateMax = procstat.Median(sorted), sorted[len(sorted)-1]

	// Idle, every zone connected.
	i0, t0 := cpu(), time.Now()
	procstat.Sleep(ctx, o.idle)
	fig.IdleCPU = 100 * (cpu() - i0).Seconds() / time.Since(t0).Seconds()
	if ctx.Err() != nil {
		return fig, ctx.Err()
	}

	// Memory: the live heap (after forced GCs, so last), the peak resident set.
	if fig.LiveHeap, err = liveHeap(control); err != nil {
		return fig, err
	}
	if _, fig.PeakRSS, err = procstat.MemOf(pid); err != nil {
		return fig, err
	}
	return fig, nil
}

// post makes a POST to a server's control endpoint that answers 204 No Content when done.
func post(client *http.Client, url string) error {
	resp, err := client.Post(url, "", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return errors.New(resp.Status)
	}
	return nil
}

// liveHeap asks a server's control endpoint for its heap after forced GCs.
func liveHeap(control string) (uint64, error) {
	resp, err := (&http.Client{Timeout: time.Minute}).Get("http://" + control + "/heap")
	if err != nil {
		return 0, fmt.Errorf("heap: %w", err)
	}
	defer resp.Body.Close()
	var h benchproc.Heap
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return 0, fmt.Errorf("heap: %w", err)
	}
	return h.HeapAlloc, nil
}

// heapPerStream is what one zone stream holding everything costs in live heap: the heap with
// every zone synced, less the heap before the first dialed, over the zones.
func (f figures) heapPerStream(zones int) float64 {
	if f.BaseHeap == 0 || f.LiveHeap < f.BaseHeap || zones == 0 { // a report from before base_heap_bytes
		return 0
	}
	return float64(f.LiveHeap-f.BaseHeap) / float64(zones)
}

// cpuPerStreamWrite is the server's CPU per update per zone stream, in µs.
func (f figures) cpuPerStreamWrite(zones int) float64 {
	if zones == 0 {
		return 0
	}
	return f.UpdateCPU * 1e6 / float64(zones)
}
