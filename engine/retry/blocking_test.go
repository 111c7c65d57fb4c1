package retry_test

import (
	"testing"
	"testing/synctest"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine/retry"
)

func TestBlockingEmulations(t *testing.T) {
	for _, tc := range []struct {
		name      string
		perStream bool
		want      time.Duration // stall of three NACKs handled back to back
	}{
		{"per type sleeps for every NACKed type", false, 15 * time.Second},
		{"per stream sleeps once for NACKs that queued during the sleep", true, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := NewWithT(t)
				r := &resender{}
				b := &retry.Blocking{PerStream: tc.perStream, Backoff: 5 * time.Second, Resender: r}
				start := time.Now()
				for _, typeURL := range []string{"Mesh", "MeshTimeout", "MeshRetry"} {
					b.Nacked(nack(typeURL, "x")) // the stream's goroutine: one callback after another
				}
				g.Expect(time.Since(start)).To(Equal(tc.want))
				g.Expect(r.Rounds()).To(HaveLen(3), "each NACK is resent after its sleep")
				// The same type NACKed again sleeps again, in both modes.
				again := time.Now()
				b.Nacked(nack("MeshTimeout", "x"))
				g.Expect(time.Since(again)).To(Equal(5 * time.Second))
				// A NACK long after the last sleep sleeps again, in both modes.
				time.Sleep(time.Second)
				before := time.Now()
				b.Nacked(nack("Mesh", "x"))
				g.Expect(time.Since(before)).To(Equal(5 * time.Second))
			})
		})
	}
}
