//go:build linux

package launch_test

import (
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/shared/launch"
)

// TestThePluginOutlivesTheThreadThatStartedIt: Linux sends Pdeathsig when the thread that
// forked the plugin exits, not the process. A plugin started from a goroutine locked to its
// thread, which then exits and takes the thread with it, must live on.
func TestThePluginOutlivesTheThreadThatStartedIt(t *testing.T) {
	g := NewWithT(t)
	bin := retryForcerBin(t)
	type started struct {
		p   *launch.Process
		err error
		tid int
	}
	ch := make(chan started, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		p, err := launch.Start(t.Context(), launch.Options{Path: bin})
		ch <- started{p, err, syscall.Gettid()}
	}()
	s := <-ch
	g.Expect(s.err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = s.p.Kill() })

	// The thread is gone once the kernel has released it, after it sent any Pdeathsig.
	task := "/proc/self/task/" + strconv.Itoa(s.tid)
	g.Eventually(func() bool { _, err := os.Stat(task); return os.IsNotExist(err) }, time.Minute, time.Millisecond).
		Should(BeTrue(), "the starting thread did not end")

	g.Expect(describe(s.p)).To(Equal("retry-forcer"), "the plugin still answers")
	g.Expect(running(s.p.Pid())).To(BeTrue())
	g.Expect(s.p.Exited()).To(BeFalse())
	g.Expect(s.p.Kill()).To(Succeed())
}
