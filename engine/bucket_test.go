package engine

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func TestTokenBucketRefillsAtItsRate(t *testing.T) {
	g := NewWithT(t)
	var b tokenBucket
	l := RateLimit{Rate: 10, Burst: 5}
	t0 := time.Unix(0, 0)
	taken := 0
	for range 20 {
		if b.allow(t0, l, 1) {
			taken++
		}
	}
	g.Expect(taken).To(Equal(5), "a full bucket gives its burst at once")
	g.Expect(b.allow(t0.Add(50*time.Millisecond), l, 1)).To(BeFalse(), "half a token")
	g.Expect(b.allow(t0.Add(100*time.Millisecond), l, 1)).To(BeTrue(), "one token after 1/rate")
	// Ten seconds of a loop of 1,000 a second: 10 a second get through.
	taken = 0
	for i := range 10_000 {
		if b.allow(t0.Add(100*time.Millisecond+time.Duration(i)*time.Millisecond), l, 1) {
			taken++
		}
	}
	g.Expect(taken).To(BeNumerically("~", 100, 1))
	// Idle for long: the bucket holds its burst, no more.
	later := t0.Add(time.Hour)
	taken = 0
	for range 20 {
		if b.allow(later, l, 1) {
			taken++
		}
	}
	g.Expect(taken).To(Equal(5))
}

// A request costs its names, a full bucket at most (so a large one is not refused for ever).
func TestTokenBucketCostsNames(t *testing.T) {
	g := NewWithT(t)
	var b tokenBucket
	l := RateLimit{Rate: 10, Burst: 5}
	t0 := time.Unix(0, 0)
	g.Expect(b.allow(t0, l, 3)).To(BeTrue())
	g.Expect(b.allow(t0, l, 3)).To(BeFalse(), "2 left")
	g.Expect(b.allow(t0, l, 2)).To(BeTrue())
	g.Expect(b.allow(t0.Add(time.Second), l, 1000)).To(BeTrue(), "a full bucket pays for any request")
	g.Expect(b.allow(t0.Add(time.Second), l, 1)).To(BeFalse())
}
