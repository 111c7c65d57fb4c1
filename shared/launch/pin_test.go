package launch_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/shared/launch"
)

// sha256Of is the SHA-256 of a file.
func sha256Of(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return sum[:]
}

// copyFile copies a binary to a folder of the test's, so the test may change it.
func copyFile(t *testing.T, src, dir string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, filepath.Base(src))
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// exe is the file a running process was started from (Linux).
func exe(t *testing.T, pid int) string {
	t.Helper()
	p, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		t.Skipf("no /proc/PID/exe here: %v", err)
	}
	return p
}

func TestAPinnedBinaryRunsFromAPrivateCopy(t *testing.T) {
	g := NewWithT(t)
	bin := copyFile(t, retryForcerBin(t), t.TempDir())
	copies := t.TempDir()
	p := start(t, launch.Options{Path: bin, SHA256: sha256Of(t, bin), CopyDir: copies})

	run := exe(t, p.Pid())
	g.Expect(run).NotTo(Equal(bin))
	g.Expect(filepath.Base(run)).To(Equal("retry-forcer"), "the copy keeps the binary's name, which names its log")
	private := filepath.Dir(run)
	g.Expect(filepath.Dir(private)).To(Equal(copies))
	g.Expect(filepath.Base(private)).To(HavePrefix("kds-host-plugin-"))
	di, err := os.Stat(private)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(di.Mode().Perm()).To(Equal(fs.FileMode(0o700)))
	fi, err := os.Stat(run)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fi.Mode().Perm()).To(Equal(fs.FileMode(0o500)))
	g.Expect(sha256Of(t, run)).To(Equal(sha256Of(t, bin)))

	// What is at the path now does not matter to the process that runs.
	g.Expect(os.WriteFile(bin, []byte("#!/bin/sh\nexit 0\n"), 0o755)).To(Succeed())
	g.Expect(describe(p)).To(Equal("retry-forcer"))
	g.Expect(p.Checksum()).To(Equal(hex.EncodeToString(sha256Of(t, run))))

	g.Expect(p.Kill()).To(Succeed())
	g.Expect(private).NotTo(BeAnExistingFile(), "the copy goes with the process")
	g.Expect(os.ReadDir(copies)).To(BeEmpty())
}

func TestAPinThatDoesNotMatchLeavesNoCopy(t *testing.T) {
	g := NewWithT(t)
	bin := retryForcerBin(t)
	copies := t.TempDir()
	wrong := make([]byte, 32)
	_, err := launch.Start(t.Context(), launch.Options{Path: bin, SHA256: wrong, CopyDir: copies})
	ce, ok := errors.AsType[*launch.ChecksumError](err)
	g.Expect(ok).To(BeTrue(), "got %v", err)
	g.Expect(ce.Path).To(Equal(bin))
	g.Expect(ce.Expected).To(Equal(strings.Repeat("0", 64)))
	g.Expect(ce.Actual).To(Equal(hex.EncodeToString(sha256Of(t, bin))))
	g.Expect(os.ReadDir(copies)).To(BeEmpty())
}

func TestAPinnedCopyInAFolderThatCannotBeMadeFails(t *testing.T) {
	g := NewWithT(t)
	bin := retryForcerBin(t)
	_, err := launch.Start(t.Context(), launch.Options{Path: bin, SHA256: sha256Of(t, bin), CopyDir: "/nonexistent/copies"})
	g.Expect(err).To(MatchError(os.ErrNotExist))
	g.Expect(err.Error()).To(HavePrefix("plugin " + bin + ": a private folder for the pinned binary: "))
}

// TestPinnedPluginsStartInParallel: each start writes a copy and execs it while the others
// fork; no copy is held open for writing by another start's child (ETXTBSY).
func TestPinnedPluginsStartInParallel(t *testing.T) {
	g := NewWithT(t)
	bin := retryForcerBin(t)
	sum := sha256Of(t, bin)
	const n = 8
	procs := make([]*launch.Process, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { procs[i], errs[i] = launch.Start(t.Context(), launch.Options{Path: bin, SHA256: sum}) })
	}
	wg.Wait()
	for i := range n {
		if procs[i] != nil {
			t.Cleanup(func() { _ = procs[i].Kill() })
		}
	}
	g.Expect(errors.Join(errs...)).NotTo(HaveOccurred())
}
