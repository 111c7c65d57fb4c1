package controlplane_test

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"

	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
)

// syncBuffer is a log output safe to write from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// A flood of refused streams costs the log a few lines a second per reason, and then one line
// that says how many it left out; the metric beside counts every one, and a zone refused for
// another reason is logged on its own.
func TestRefusedStreamsAreLoggedAFewASecondAndEachCounted(t *testing.T) {
	g := NewWithT(t)
	const flood = 40
	out := &syncBuffer{}
	reg := resource.Default()
	gl := startGlobal(t, openSQLite(t), reg, func(c *controlplane.GlobalConfig) {
		c.Logger = hclog.New(&hclog.LoggerOptions{Output: out, Level: hclog.Warn})
	})
	for range flood {
		g.Expect(streamStatus(t, gl.KDSAddr(), "zone-1", "").Code()).To(Equal(codes.Unauthenticated))
	}
	g.Expect(streamStatus(t, gl.KDSAddr(), "zone-1", token(t, auth.Claims{Kind: auth.KindZone, Name: "zone-2"})).Code()).To(Equal(codes.PermissionDenied))
	g.Expect(metric(t, gl.DiagAddr(), "kds_stream_refusals_total")).To(Equal(flood + 1.0))

	// Each window of a second writes 5 lines at most, then how many it left out.
	leftOut := regexp.MustCompile(`KDS stream refused: (\d+) more not logged in 1s: reason=unauthenticated`)
	accounted := func() int {
		s := out.String()
		n := strings.Count(s, "KDS stream refused: reason=unauthenticated")
		for _, m := range leftOut.FindAllStringSubmatch(s, -1) {
			k, _ := strconv.Atoi(m[1])
			n += k
		}
		return n
	}
	g.Eventually(accounted, 10*time.Second).Should(Equal(flood))
	g.Expect(strings.Count(out.String(), "KDS stream refused: reason=unauthenticated")).To(BeNumerically("<", flood/2))
	g.Expect(out.String()).To(ContainSubstring("KDS stream refused: reason=permission_denied"))
}
