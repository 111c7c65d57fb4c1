package retrypolicy

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/onsi/gomega"
)

func TestBetween(t *testing.T) {
	g := gomega.NewWithT(t)
	s := &source{r: rand.New(rand.NewPCG(1, 2))}
	g.Expect(s.between(5, 5)).To(gomega.Equal(time.Duration(5)))
	g.Expect(s.between(5, 3)).To(gomega.Equal(time.Duration(5)))
	for range 1000 {
		g.Expect(s.between(0, math.MaxInt64)).To(gomega.BeNumerically(">=", 0))
		g.Expect(s.between(1, 2)).To(gomega.BeElementOf(time.Duration(1), time.Duration(2)))
	}
}
