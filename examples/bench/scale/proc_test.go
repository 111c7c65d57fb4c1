//go:build linux

package main

import (
	"os"
	"syscall"
	"testing"
)

// minorFaultsOf counts a process's first touches of memory: writing a page of each of 2,048
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
	before, err := minorFaultsOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < size; i += os.Getpagesize() {
		b[i] = 1
	}
	after, err := minorFaultsOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d := after - before; d < pages || d > 2*pages {
		t.Fatalf("touching %d fresh pages counted %d faults", pages, d)
	}
}
