// Command machine measures what the other cores' load does to one process's CPU time on this
// machine, the noise under every CPU figure of the benches that share its cores (a replica's CPU
// per write with two more replicas up, a server's sync CPU beside its zones' process). It runs
// two kinds of work on one core, alone, then with a busy process of each kind on each other
// core, and prints the CPU time each took, medians of -rounds:
//
//   - compute: SHA-256 of a 64 KiB buffer, in the core's own caches;
//   - memory: random reads of a map of 4 Mi entries (about 150 MiB), as a control plane's
//     pointer-chasing work (maps, the garbage collector's marking) does;
//   - first touch: a write to each page of 64 MiB of memory the process maps fresh, each a page
//     fault, as a process pays for memory it has not used before (a new goroutine's stack, a heap
//     that grows); printed a page, too. On a virtual machine this is the hypervisor's price, and
//     it moves a bench's CPU figures with the memory each server touches.
//
// Usage:
//
//	go run ./examples/bench/machine [-rounds 5]
//
// A ratio well above 1 beside memory work says that this machine's cores share what a
// pointer-chasing process needs (the last-level cache, memory bandwidth): CPU figures measured
// with the cores busy are then that much higher than the same work's on a quiet machine.
package main

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"syscall"
	"time"
)

func main() {
	rounds := flag.Int("rounds", 5, "measurements of each work, alone and beside the busy cores; the figures are their medians")
	spin := flag.String("spin", "", "internal: be a busy process until killed, doing the compute work, or (memory) the map reads and the compute work in turn")
	flag.Parse()
	runtime.GOMAXPROCS(1)
	switch *spin {
	case "":
	case "compute", "memory":
		w := newWork(*spin == "memory")
		for {
			w.measure(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "machine: -spin %q: want compute or memory\n", *spin)
		os.Exit(2)
	}
	if *rounds < 1 {
		fmt.Fprintln(os.Stderr, "machine: -rounds must be at least 1")
		os.Exit(2)
	}
	if err := run(*rounds); err != nil {
		fmt.Fprintln(os.Stderr, "machine:", err)
		os.Exit(1)
	}
}

func run(rounds int) error {
	w := newWork(true)
	w.touch = true // the busy processes do not: their memory work stays as it was
	alone := w.measure(rounds)
	beside := map[string][3]time.Duration{}
	for _, kind := range []string{"compute", "memory"} {
		d, err := besideBusy(w, rounds, kind)
		if err != nil {
			return err
		}
		beside[kind] = d
	}
	fmt.Printf("%d cores, %s; one process on one core, CPU time, medians of %d rounds;\n", runtime.NumCPU(), runtime.Version(), rounds)
	fmt.Printf("beside: a busy process on each other core doing the compute work, or the memory work and the compute work in turn\n\n")
	fmt.Printf("  %-11s  %10s  %18s  %17s\n", "work", "alone", "beside compute", "beside memory")
	for i, name := range []string{"compute", "memory", "first touch"} {
		c, m := beside["compute"][i], beside["memory"][i]
		fmt.Printf("  %-11s  %7.1f ms  %7.1f ms %5.2fx  %7.1f ms %5.2fx\n", name, ms(alone[i]),
			ms(c), float64(c)/float64(alone[i]), ms(m), float64(m)/float64(alone[i]))
	}
	pages := float64(touchBytes / os.Getpagesize())
	fmt.Printf("\n  first touch, a page: %.2f us alone, %.2f beside compute, %.2f beside memory\n",
		us(alone[2])/pages, us(beside["compute"][2])/pages, us(beside["memory"][2])/pages)
	return nil
}

// besideBusy measures w with a busy process doing kind on every other core.
func besideBusy(w *work, rounds int, kind string) ([3]time.Duration, error) {
	self, err := os.Executable()
	if err != nil {
		return [3]time.Duration{}, err
	}
	var busy []*exec.Cmd
	defer func() {
		for _, c := range busy {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	for range runtime.NumCPU() - 1 {
		c := exec.Command(self, "-spin", kind)
		if err := c.Start(); err != nil {
			return [3]time.Duration{}, fmt.Errorf("start a busy process: %w", err)
		}
		busy = append(busy, c)
	}
	time.Sleep(2 * time.Second) // the busy processes built their maps and are at work
	return w.measure(rounds), nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

type work struct {
	buf   []byte
	m     map[uint32]uint32
	touch bool // measure the first touch too
}

const mapEntries = 4 << 20

// newWork makes the buffer, and the map when memory work is to be measured.
func newWork(memory bool) *work {
	w := &work{buf: make([]byte, 64<<10)}
	if memory {
		w.m = make(map[uint32]uint32, mapEntries)
		for i := range uint32(mapEntries) {
			w.m[i] = i
		}
	}
	return w
}

// touchBytes is what the first-touch work maps and writes, a page at a time.
const touchBytes = 64 << 20

// measure returns the median CPU time of the compute work, of the memory work and of the first
// touch (0 unless w.touch).
func (w *work) measure(rounds int) [3]time.Duration {
	var compute, memory, touch []time.Duration
	var sink uint32
	for range rounds {
		c0 := cpuTime()
		for range 4000 {
			sum := sha256.Sum256(w.buf)
			sink += uint32(sum[0])
		}
		c1 := cpuTime()
		x := uint32(1)
		for i := 0; w.m != nil && i < 2<<20; i++ {
			x = x*1664525 + 1013904223 // a random walk over the keys
			sink += w.m[x%mapEntries]
		}
		c2 := cpuTime()
		if w.touch {
			touchFresh()
		}
		c3 := cpuTime()
		compute, memory, touch = append(compute, c1-c0), append(memory, c2-c1), append(touch, c3-c2)
	}
	if sink == 1 {
		fmt.Print("") // keep sink live
	}
	return [3]time.Duration{median(compute), median(memory), median(touch)}
}

// touchFresh maps touchBytes of memory the process has not used, writes a byte on each page (a
// page fault each), and unmaps it.
func touchFresh() {
	b, err := syscall.Mmap(-1, 0, touchBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		fmt.Fprintln(os.Stderr, "machine: map memory to touch:", err)
		os.Exit(1)
	}
	for i := 0; i < len(b); i += os.Getpagesize() {
		b[i] = 1
	}
	if err := syscall.Munmap(b); err != nil {
		fmt.Fprintln(os.Stderr, "machine: unmap:", err)
		os.Exit(1)
	}
}

func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
