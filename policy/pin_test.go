package policy_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/policy"
	"github.com/kds-host/kds-host/shared/launch"
)

// swappable is a plugin path whose file a test replaces at will, atomically (a rename over
// it, as a package manager or a deploy does).
type swappable struct {
	path string
	dir  string
	n    atomic.Int64
}

// put makes the file at the path the one at src.
func (s *swappable) put(t *testing.T, src string) {
	tmp := filepath.Join(s.dir, ".swap-"+strconv.FormatInt(s.n.Add(1), 10))
	if err := os.Link(src, tmp); err != nil {
		t.Error(err)
		return
	}
	if err := os.Rename(tmp, s.path); err != nil {
		t.Error(err)
	}
}

// flip swaps the file at the path between a and b as fast as it can until stop is closed.
func (s *swappable) flip(t *testing.T, a, b string, stop <-chan struct{}) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		if i%2 == 0 {
			s.put(t, a)
		} else {
			s.put(t, b)
		}
	}
}

// TestAPinnedPluginRunsExactlyTheBytesThatWereHashed reloads a pinned plugin again and again
// while the file at its path is swapped for another program, one that records that it ran. The
// other program never runs: every reload runs the pinned bytes or fails with the checksum
// error. go-plugin alone hashes the path and then executes whatever is there by then.
func TestAPinnedPluginRunsExactlyTheBytesThatWereHashed(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	b, err := os.ReadFile(retryForcerBin(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.WriteFile(good, b, 0o755)).To(Succeed())
	marker := filepath.Join(dir, "the-other-program-ran")
	other := filepath.Join(dir, "other")
	g.Expect(os.WriteFile(other, []byte("#!/bin/sh\ntouch '"+marker+"'\n"), 0o755)).To(Succeed())
	pin, otherSum := sha256File(t, good), sha256File(t, other)

	s := &swappable{path: filepath.Join(dir, "retry-forcer"), dir: dir}
	s.put(t, good)
	spec, err := policy.ParseSpec(s.path + "@sha256:" + pin)
	g.Expect(err).NotTo(HaveOccurred())
	rt := start(t, config(spec))
	reload := func() error {
		return rt.Reload(context.Background(), static(policy.Plugins{List: []policy.Spec{spec}}))
	}

	const reloads = 30
	var ran, refused int
	for i := range reloads {
		// Three cases in turn: the path holds the pinned binary, it holds the other program,
		// and it changes between the two all through the reload.
		var stop chan struct{}
		var flipper sync.WaitGroup
		switch i % 3 {
		case 0:
			s.put(t, good)
		case 1:
			s.put(t, other)
		case 2:
			stop = make(chan struct{})
			flipper.Go(func() { s.flip(t, good, other, stop) })
		}
		err := reload()
		if stop != nil {
			close(stop)
			flipper.Wait()
		}
		at := fmt.Sprintf("reload %d (case %d)", i, i%3)
		g.Expect(marker).NotTo(BeAnExistingFile(), "%s: the other program ran", at)

		if err == nil {
			ran++
			g.Expect(i%3).NotTo(Equal(1), "%s: the other program's bytes were taken for the pinned ones", at)
			st := statusOf(rt, "retry-forcer")
			g.Expect(st.State).To(Equal(policy.StateRunning), at)
			g.Expect(st.Checksum).To(Equal("sha256:"+pin), at)
			// What the process runs is the pinned bytes (Linux: its executable, through /proc).
			g.Expect(sha256File(t, "/proc/"+strconv.Itoa(st.PID)+"/exe")).To(Equal(pin), at)
			_, err = schedule(rt)
			g.Expect(err).NotTo(HaveOccurred(), at)
			continue
		}
		refused++
		g.Expect(i%3).NotTo(Equal(0), "%s: the pinned binary was refused: %v", at, err)
		ce, ok := errors.AsType[*launch.ChecksumError](err)
		g.Expect(ok).To(BeTrue(), "%s: want the checksum error, got %v", at, err)
		g.Expect(ce.Expected).To(Equal(pin), at)
		g.Expect(ce.Actual).To(Equal(otherSum), at)
		g.Expect(statusOf(rt, "retry-forcer").State).To(Equal(policy.StateRunning), "%s: the running plugin stays", at)
	}
	t.Logf("%d reloads: %d ran the pinned bytes, %d were refused (checksum), the other program ran 0 times", reloads, ran, refused)
	g.Expect(ran).To(BeNumerically(">=", reloads/3))
	g.Expect(refused).To(BeNumerically(">=", reloads/3))
}
