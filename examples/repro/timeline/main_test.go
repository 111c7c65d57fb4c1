package main

import (
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

const sampleFile = `# label=async <retry> & "more" outage=Mesh=2s,MeshRetry=60s
t=0.08 event=zone-up
t=0.13 timeouts=0 nacks=5 rounds=1
t=0.13 event=rejection
t=0.16 event=applied
t=0.22 timeouts=0 nacks=10 rounds=2
t=2.15 timeouts=3 nacks=18 rounds=4
t=2.20 event=converged
`

func TestATimelineFileIsDrawnAsOneWellFormedSVG(t *testing.T) {
	g := NewWithT(t)
	r, err := parse(strings.NewReader(sampleFile))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.label).To(Equal(`async <retry> & "more"`))
	g.Expect(r.outages).To(HaveLen(2))
	g.Expect(r.samples).To(HaveLen(3))
	conv, ok := r.converged()
	g.Expect(ok).To(BeTrue())
	g.Expect(conv).To(BeNumerically("~", 1.99, 1e-9), "the first sample holding 3, since the apply")

	stalled, err := parse(strings.NewReader("# label=stalled outage=Mesh=1h\nt=0.1 event=applied\nt=0.2 timeouts=0 nacks=1 rounds=0\n"))
	g.Expect(err).NotTo(HaveOccurred())
	_, ok = stalled.converged()
	g.Expect(ok).To(BeFalse())

	var b strings.Builder
	g.Expect(draw(&b, "A. Mesh refused for 2s <&>", []run{r, stalled})).To(Succeed())
	svg := b.String()
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		g.Expect(err).NotTo(HaveOccurred(), "well-formed XML")
	}
	g.Expect(svg).To(ContainSubstring("async &lt;retry&gt; &amp; &#34;more&#34;"))
	g.Expect(svg).To(ContainSubstring("converged after 1.99 s"))
	g.Expect(svg).To(ContainSubstring("did not converge"))
	g.Expect(strings.Count(svg, "<path ")).To(Equal(4), "NACKs and rounds per panel")

	_, err = parse(strings.NewReader("t=0.1 timeouts=0 nacks=1 rounds=0\n"))
	g.Expect(err).To(MatchError(ContainSubstring("event=applied")))
	_, err = parse(strings.NewReader("t=x event=applied\n"))
	g.Expect(err).To(MatchError(ContainSubstring("line 1")))
}
