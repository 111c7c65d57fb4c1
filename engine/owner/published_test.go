package owner

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/host/resource"
)

// Own verdicts written check after check: the newest wins, a published chain never changes
// after it was published, and past maxLayers the chain is merged into one map with the same
// answers.
func TestOwnLayersKeepTheNewestVerdictAndNeverChangeAPublishedChain(t *testing.T) {
	g := NewWithT(t)
	key := func(i int) engine.Ref { return ref(resource.Key{Kind: "MeshTimeout", Mesh: "m", Name: fmt.Sprint(i)}) }
	var o ownLayers
	var published [][]Verdicts
	for check := range 2 * maxLayers {
		o.set(key(check), Verdict{Version: fmt.Sprint("v", check)})
		o.set(key(0), Verdict{Version: fmt.Sprint("zero-", check)}) // rewritten by every check
		published = append(published, o.freeze())
		g.Expect(len(o.frozen)).To(BeNumerically("<=", maxLayers))
	}
	g.Expect(o.len()).To(Equal(2 * maxLayers))
	v, ok := o.get(key(0))
	g.Expect(ok).To(BeTrue())
	g.Expect(v.Version).To(Equal(fmt.Sprint("zero-", 2*maxLayers-1)))
	for i := 1; i < 2*maxLayers; i++ {
		v, _ := o.get(key(i))
		g.Expect(v.Version).To(Equal(fmt.Sprint("v", i)))
	}
	n := 0
	o.each(func(engine.Ref, Verdict) { n++ })
	g.Expect(n).To(Equal(2*maxLayers), "each key once")

	// The first published chain still says what it said.
	first, ok := layersGet(published[0], key(0))
	g.Expect(ok).To(BeTrue())
	g.Expect(first.Version).To(Equal("zero-0"))
	_, ok = layersGet(published[0], key(1))
	g.Expect(ok).To(BeFalse())
}
