// Package benchcp runs a global and zones in one process, on loopback with plaintext KDS and
// SQLite stores in a temp dir, for the benchmark programs under examples/bench.
package benchcp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/zone"
)

// stopTimeout bounds how long a stopping control plane may take.
const stopTimeout = 15 * time.Second

// Logger returns a logger at level ("off" discards everything).
func Logger(level, name string) hclog.Logger {
	if level == "" || level == "off" {
		return hclog.NewNullLogger()
	}
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.LevelFromString(level), Output: os.Stderr})
}

// OpenSQLite opens a SQLite store under dir.
func OpenSQLite(ctx context.Context, dir string) (store.Store, error) {
	return store.Open(ctx, "", dir)
}

// Running is a control plane whose Run goroutine is going; Stop ends it.
type Running struct {
	cancel context.CancelFunc
	done   chan error

	stopOnce sync.Once
	stopErr  error
}

func run(ctx context.Context, f func(context.Context) error) *Running {
	ctx, cancel := context.WithCancel(ctx)
	r := &Running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- f(ctx) }()
	return r
}

// Stop cancels the control plane and waits for Run to return, at most 15 s. Calling it again
// returns the first call's result.
func (r *Running) Stop() error {
	r.stopOnce.Do(func() {
		r.cancel()
		select {
		case r.stopErr = <-r.done:
		case <-time.After(stopTimeout):
			r.stopErr = fmt.Errorf("did not stop within %s", stopTimeout)
		}
	})
	return r.stopErr
}

// Global is a running global.
type Global struct {
	*controlplane.Global
	*Running
}

// StartGlobal assembles a global on loopback (cfg's addresses default to 127.0.0.1:0), runs it,
// and waits until it serves KDS (its first snapshot is built).
func StartGlobal(ctx context.Context, cfg controlplane.GlobalConfig) (*Global, error) {
	for _, a := range []*string{&cfg.KDSAddr, &cfg.APIAddr, &cfg.DiagAddr} {
		if *a == "" {
			*a = "127.0.0.1:0"
		}
	}
	g, err := controlplane.NewGlobal(cfg)
	if err != nil {
		return nil, err
	}
	gl := &Global{Global: g, Running: run(ctx, g.Run)}
	if err := WaitReady(ctx, g.DiagAddr(), gl.Running); err != nil {
		gl.Stop()
		return nil, fmt.Errorf("global: %w", err)
	}
	return gl, nil
}

// Zone is an assembled zone control plane, not yet running.
type Zone struct {
	*controlplane.Zone
	Name  string
	Store store.Store
	run   *Running
}

// NewZone assembles a zone of the global at kdsAddr over st; Start runs it.
func NewZone(name, kdsAddr string, st store.Store, reg *resource.Registry, log hclog.Logger, kcfg zone.Config) (*Zone, error) {
	kcfg.Zone = name
	kcfg.GlobalAddress = "grpc://" + kdsAddr
	if kcfg.BackoffMin == 0 {
		kcfg.BackoffMin, kcfg.BackoffMax = 20*time.Millisecond, 200*time.Millisecond
	}
	z, err := controlplane.NewZone(controlplane.ZoneConfig{Store: st, Registry: reg, APIAddr: "127.0.0.1:0", DiagAddr: "127.0.0.1:0",
		Logger: log, KDS: kcfg})
	if err != nil {
		return nil, err
	}
	return &Zone{Zone: z, Name: name, Store: st}, nil
}

// Start runs the zone.
func (z *Zone) Start(ctx context.Context) { z.run = run(ctx, z.Run) }

// Stop stops the zone. A zone never started is run with a canceled context, which releases
// the listeners NewZone opened.
func (z *Zone) Stop() error {
	if z.run == nil {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		z.run = run(ctx, z.Run)
	}
	return z.run.Stop()
}

// WaitReady polls http://diag/readyz until it answers 200, the control plane's Run ends, or
// ctx ends.
func WaitReady(ctx context.Context, diagAddr string, r *Running) error {
	url := "http://" + diagAddr + "/readyz"
	for {
		if ok, _ := httpOK(ctx, url); ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-r.done:
			r.done <- err // keep it for Stop
			return fmt.Errorf("stopped before it was ready: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func httpOK(ctx context.Context, url string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK, nil
}

// Mesh is a Mesh resource.
func Mesh(name string) resource.Resource {
	return resource.Resource{Kind: resource.MeshKind, Name: name, Spec: json.RawMessage(`{}`), Generation: 1}
}

// Timeout is a MeshTimeout whose connection timeout is d.
func Timeout(mesh, name string, d time.Duration) resource.Resource {
	return resource.Resource{Kind: "MeshTimeout", Mesh: mesh, Name: name, Generation: 1,
		Spec: json.RawMessage(`{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"` + d.String() + `"}}`)}
}

// Fill writes rs to st with Apply, in batches.
func Fill(ctx context.Context, st store.Store, rs []resource.Resource, batch int) error {
	for len(rs) > 0 {
		n := min(batch, len(rs))
		failed, err := st.Apply(ctx, rs[:n], nil)
		if err != nil {
			return err
		}
		for k, err := range failed {
			return fmt.Errorf("fill %s: %w", k, err)
		}
		rs = rs[n:]
	}
	return nil
}

// MemSample is the process's memory: the Go heap in use, what the runtime got from the OS,
// and the resident set (VmRSS) and its high-water mark (VmHWM).
type MemSample struct {
	HeapInuse, Sys uint64
	RSS, HWM       uint64
}

// ResetHWM resets the kernel's peak RSS of this process (VmHWM) to the current RSS, by writing
// 5 to /proc/self/clear_refs (Linux 4.0+).
func ResetHWM() error {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// ProcStatus reads VmRSS and VmHWM (bytes) from /proc/self/status.
func ProcStatus() (rss, hwm uint64, err error) { return ProcStatusOf("self") }

// ProcStatusOf reads VmRSS and VmHWM (bytes) from /proc/PID/status ("self": this process).
func ProcStatusOf(pid string) (rss, hwm uint64, err error) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		var dst *uint64
		switch f[0] {
		case "VmRSS:":
			dst = &rss
		case "VmHWM:":
			dst = &hwm
		default:
			continue
		}
		kb, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/%s/status %s: %w", pid, f[0], err)
		}
		*dst = kb << 10
	}
	return rss, hwm, nil
}

// MiB formats bytes as mebibytes.
func MiB(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// Ms formats a duration in milliseconds with two decimals.
func Ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
