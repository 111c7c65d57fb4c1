//go:build linux

package procstat

import (
	"os"
	"syscall"
	"testing"
)

// MinorFaultsOf counts a process's first touches of memory: writing a page of each of 2,048
// pages mapped fresh takes a fault each.
func TestMinorFaultsCountFirstTouches(t *testing.T) {
	const pages = 2048
	size := pages * os.Getpagesize()
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(b)
	if err := syscall.Madvise(b, syscall.MADV_NOHUGEPAGE); err != nil { // a fault a 4 KiB page, whatever the machine's THP
		t.Fatal(err)
	}
	before, err := MinorFaultsOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < size; i += os.Getpagesize() {
		b[i] = 1
	}
	after, err := MinorFaultsOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d := after - before; d < pages || d > 2*pages {
		t.Fatalf("touching %d fresh pages counted %d faults", pages, d)
	}
}

// SyscallsOf counts a process's reads and writes: 1,000 one-byte writes to a pipe and 1,000
// reads of them are at least 2,000 more (other goroutines of the test binary may add a few).
func TestSyscallsCountReadsAndWrites(t *testing.T) {
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	before, err := SyscallsOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	b := []byte{1}
	for range n {
		if _, err := syscall.Write(p[1], b); err != nil {
			t.Fatal(err)
		}
		if _, err := syscall.Read(p[0], b); err != nil {
			t.Fatal(err)
		}
	}
	after, err := SyscallsOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d := after - before; d < 2*n || d > 2*n+200 {
		t.Fatalf("%d writes and %d reads counted %d system calls", n, n, d)
	}
}
