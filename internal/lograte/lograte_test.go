package lograte_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/internal/lograte"
)

// buffer is a log output safe to write from several goroutines.
type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Split(strings.TrimSpace(b.b.String()), "\n")
}

func newLog(out *buffer) *lograte.Log {
	return lograte.New(slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})), time.Second, 3, "reason")
}

// A flood of lines of one key writes the burst, then, once its window ends, one line that says
// how many were left out; another key has its own window, and the next window its own burst.
func TestAFloodOfOneKindWritesAFewLinesAndHowManyItLeftOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		out := &buffer{}
		l := newLog(out)
		defer l.Close()
		written := 0
		for range 3200 {
			if l.Log("unauthenticated", slog.LevelWarn, "KDS stream refused", "reason", "unauthenticated") {
				written++
			}
		}
		g.Expect(l.Log("limit", slog.LevelWarn, "KDS stream refused", "reason", "limit")).To(BeTrue())
		g.Expect(written).To(Equal(3))
		g.Expect(out.lines()).To(HaveLen(4))

		time.Sleep(time.Second)
		synctest.Wait()
		g.Expect(out.lines()).To(HaveLen(5))
		g.Expect(out.lines()[4]).To(Equal(`level=WARN msg="KDS stream refused: 3197 more not logged in 1s" reason=unauthenticated`))

		g.Expect(l.Log("unauthenticated", slog.LevelWarn, "KDS stream refused")).To(BeTrue(), "a new window")
		time.Sleep(time.Second)
		synctest.Wait()
		g.Expect(out.lines()).To(HaveLen(6), "nothing left out, nothing said")
	})
}

// Close says what its open windows left out, and writes every later line.
func TestCloseSaysWhatWasLeftOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		out := &buffer{}
		l := newLog(out)
		for range 10 {
			l.Log("limit", slog.LevelInfo, "refused")
		}
		l.Close()
		g.Expect(out.lines()).To(HaveLen(4))
		g.Expect(out.lines()[3]).To(ContainSubstring(`msg="refused: 7 more not logged in 1s" reason=limit`))
		g.Expect(l.Log("limit", slog.LevelInfo, "refused")).To(BeTrue())
		time.Sleep(2 * time.Second)
		synctest.Wait()
		g.Expect(out.lines()).To(HaveLen(5))
	})
}
