package policy

import (
	"encoding/json"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func TestLatencyPercentilesOverTheLatestCalls(t *testing.T) {
	g := NewWithT(t)
	var s callStats
	var st Status
	s.fill(&st)
	g.Expect(st.Latency).To(Equal(Latency{}), "no calls, no percentiles")

	for i := 1; i <= 100; i++ {
		s.record(time.Duration(i)*time.Millisecond, i%10 == 0, i%50 == 0)
	}
	s.fill(&st)
	g.Expect(st.Calls).To(BeEquivalentTo(100))
	g.Expect(st.Errors).To(BeEquivalentTo(10))
	g.Expect(st.Timeouts).To(BeEquivalentTo(2))
	g.Expect(st.Latency).To(Equal(Latency{P50: Duration(50 * time.Millisecond), P90: Duration(90 * time.Millisecond), P99: Duration(99 * time.Millisecond)}))

	// Only the latest 1024 calls count.
	for range latencyWindow {
		s.record(time.Second, false, false)
	}
	s.fill(&st)
	g.Expect(st.Latency.P50).To(Equal(Duration(time.Second)))
	g.Expect(st.Calls).To(BeEquivalentTo(100 + latencyWindow))

	b, err := json.Marshal(st.Latency)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(b)).To(Equal(`{"p50":"1s","p90":"1s","p99":"1s"}`))
	var back Latency
	g.Expect(json.Unmarshal([]byte(`{"p50":"1.5ms","p90":"2ms","p99":"310µs"}`), &back)).To(Succeed())
	g.Expect(back.P99).To(Equal(Duration(310 * time.Microsecond)))
}
