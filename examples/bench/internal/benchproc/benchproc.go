// Package benchproc is what examples/bench/scale and the server processes it starts agree on:
// the resources every server serves, the line a server prints once it serves, its control
// endpoint (one update, the live heap), its CPU profile, and how it is stopped (its standard
// input closes).
package benchproc

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kds-host/kds-host/examples/bench/internal/benchcp"
	"github.com/kds-host/kds-host/host/resource"
)

// Mesh is the one Mesh every server serves; the MeshTimeouts are in it.
const Mesh = "default"

// TimeoutName is the name of the i-th MeshTimeout (1-based), and its xDS name within the kind is
// Mesh + "/" + TimeoutName(i).
func TimeoutName(i int) string { return fmt.Sprintf("timeout-%05d", i) }

// ZoneName is the name of zone i (0-based): its node id, and the name in its zone token.
func ZoneName(i int) string { return fmt.Sprintf("zone-%04d", i) }

// Target is the index of the MeshTimeout that every update changes.
const Target = 1

// Resources is what a server with n resources serves: Mesh "default" and n MeshTimeouts in it,
// the same list as examples/bench/fullsync's.
func Resources(n int) []resource.Resource {
	rs := make([]resource.Resource, 0, n+1)
	rs = append(rs, benchcp.Mesh(Mesh))
	for i := 1; i <= n; i++ {
		rs = append(rs, benchcp.Timeout(Mesh, TimeoutName(i), time.Duration(i)*time.Millisecond))
	}
	return rs
}

// Updated is the target MeshTimeout as update seq (0, 1, ...) leaves it: its connection timeout
// is seq+1 seconds, so every update changes its content. Its generation is 0 (a store write
// takes the stored one).
func Updated(seq int) resource.Resource {
	r := benchcp.Timeout(Mesh, TimeoutName(Target), time.Duration(seq+1)*time.Second)
	r.Generation = 0
	return r
}

// Index reads which of Resources a delivered resource is, from its kind (type URL) and xDS name:
// 0 for the Mesh, i for the i-th MeshTimeout; ok is false for anything else. A MeshTimeout's
// name may lack its mesh: the guard names a kds.v1.Resource by its name field, as
// go-control-plane's cache.GetResourceName does.
func Index(typeURL, name string) (int, bool) {
	switch typeURL {
	case resource.MeshKind:
		return 0, name == Mesh
	case "MeshTimeout":
		n, found := strings.CutPrefix(strings.TrimPrefix(name, Mesh+"/"), "timeout-")
		if !found {
			return 0, false
		}
		i, err := strconv.Atoi(n)
		return i, err == nil && i > 0
	}
	return 0, false
}

// Ready is the line a server prints on its standard output once it serves KDS.
func Ready(kdsAddr, controlAddr string) string {
	return fmt.Sprintf("ready kds=%s control=%s", kdsAddr, controlAddr)
}

// ParseReady reads a Ready line.
func ParseReady(line string) (kdsAddr, controlAddr string, err error) {
	_, err = fmt.Sscanf(strings.TrimSpace(line), "ready kds=%s control=%s", &kdsAddr, &controlAddr)
	if err != nil {
		return "", "", fmt.Errorf("not a ready line: %q", line)
	}
	return kdsAddr, controlAddr, nil
}

// Heap is what GET /heap answers: the live heap after two forced GCs.
type Heap struct {
	HeapAlloc uint64 `json:"heap_alloc"`
	HeapSys   uint64 `json:"heap_sys"`
	NumGC     uint32 `json:"num_gc"`
}

// LiveHeap forces two GCs and reads the heap.
func LiveHeap() Heap {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return Heap{HeapAlloc: m.HeapAlloc, HeapSys: m.HeapSys, NumGC: m.NumGC}
}

// Control serves a server's control endpoint on a loopback port, for the driver that started the
// server (anyone on the machine could reach it: a bench server serves nothing worth guarding):
//
//	POST /update?seq=N  makes update N (see Updated) and answers once it is written
//	GET  /heap          answers Heap, as JSON
//	POST /synced        the full sync is done: the CPU profile goes on into prof.CPUAfterSync
//
// It returns the bound address; the server stops when ctx ends.
// With prof.Heap set, GET /heap also writes a heap profile there once it has measured.
func Control(ctx context.Context, prof *Profiles, update func(ctx context.Context, seq int) error) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /update", func(w http.ResponseWriter, r *http.Request) {
		seq, err := strconv.Atoi(r.URL.Query().Get("seq"))
		if err != nil || seq < 0 {
			http.Error(w, "seq: want a number >= 0", http.StatusBadRequest)
			return
		}
		if err := update(r.Context(), seq); err != nil {
			http.Error(w, fmt.Sprintf("update %d: %v", seq, err), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /heap", func(w http.ResponseWriter, r *http.Request) {
		h := LiveHeap()
		if prof.Heap != "" {
			if err := writeHeapProfile(prof.Heap); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(h)
	})
	mux.HandleFunc("POST /synced", func(w http.ResponseWriter, r *http.Request) {
		if err := prof.afterSync(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return ln.Addr().String(), nil
}

// Profiles are a server's -cpuprofile, -cpuprofile-after-sync and -heapprofile flags.
type Profiles struct {
	CPU string // a CPU profile, from serving until exit, or until POST /synced with CPUAfterSync
	// CPUAfterSync takes the CPU profile on from POST /synced until exit, so that CPU holds the
	// full sync alone.
	CPUAfterSync string
	Heap         string // a heap profile, when GET /heap has measured the live heap

	mu   sync.Mutex
	file *os.File // the CPU profile being written, or nil
}

// ProfileFlags registers -cpuprofile, -cpuprofile-after-sync and -heapprofile on the command
// line.
func ProfileFlags() *Profiles {
	p := &Profiles{}
	flag.StringVar(&p.CPU, "cpuprofile", "", "write a CPU profile, from serving until exit (or until the full sync is done, with -cpuprofile-after-sync), to this file")
	flag.StringVar(&p.CPUAfterSync, "cpuprofile-after-sync", "", "write the CPU profile from the end of the full sync (the driver's POST /synced) until exit to this file")
	flag.StringVar(&p.Heap, "heapprofile", "", "write a heap profile to this file when GET /heap has measured the live heap")
	return p
}

// StartCPU starts the CPU profile into p.CPU ("" profiles nothing); StopCPU ends it.
func (p *Profiles) StartCPU() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.startLocked(p.CPU)
}

// StopCPU ends the CPU profile being written, if any, and closes its file.
func (p *Profiles) StopCPU() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopLocked()
}

// afterSync ends the full sync's CPU profile and starts the one after it, with -cpuprofile-after-sync.
func (p *Profiles) afterSync() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.CPUAfterSync == "" || p.file == nil {
		return nil
	}
	if err := p.stopLocked(); err != nil {
		return err
	}
	return p.startLocked(p.CPUAfterSync)
}

func (p *Profiles) startLocked(file string) error {
	if file == "" {
		return nil
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return err
	}
	p.file = f
	return nil
}

func (p *Profiles) stopLocked() error {
	if p.file == nil {
		return nil
	}
	pprof.StopCPUProfile()
	err := p.file.Close()
	p.file = nil
	return err
}

func writeHeapProfile(file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// UntilStdinCloses returns a context that ends when the process's standard input reaches its
// end (the driver closed it, or died) or the parent ctx ends.
func UntilStdinCloses(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
		cancel()
	}()
	return ctx, cancel
}
