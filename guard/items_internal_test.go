package guard

import (
	"sync"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kds-host/kds-host/engine"
)

// A RawResponse's resource is encoded once for every node given the same message at the same
// version; a message changed in place under a new version is encoded again, and its entry says
// so; the same content under another version is the same entry.
func TestARawResourceIsEncodedOnceAVersion(t *testing.T) {
	g := NewWithT(t)
	c := newItemCache()
	ofRaw := func(typeURL, version string, m Resource, owners func(string, Resource) []Ref) (*engine.Entry, error) {
		es, errs := c.ofRaws(typeURL, version, []types.ResourceWithTTL{{Resource: m}}, owners)
		if errs != nil {
			return es[0], errs[0]
		}
		return es[0], nil
	}
	m := eds("a")
	e1, err := ofRaw(resource.ClusterType, "1", m, EnvoyReferences)
	g.Expect(err).NotTo(HaveOccurred())
	m.ConnectTimeout = durationpb.New(5e9) // changed in place: a cache that serves it again at "1" breaks its own contract
	again, err := ofRaw(resource.ClusterType, "1", m, EnvoyReferences)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again).To(BeIdenticalTo(e1), "the same message at the same version: not encoded again")

	e2, err := ofRaw(resource.ClusterType, "2", m, EnvoyReferences)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(e2).NotTo(BeIdenticalTo(e1))
	g.Expect(e2.Version).NotTo(Equal(e1.Version), "its new content, under the new version")

	same, err := ofRaw(resource.ClusterType, "3", eds("a"), EnvoyReferences)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(same).To(BeIdenticalTo(e1), "another message of the same content: the same entry")
}

// The nodes that read a version at once get the same entries, made by one of them; a resource
// that cannot be read has its error for each, and the others their entries.
func TestNodesReadingAVersionAtOnceGetTheEntriesOneOfThemMade(t *testing.T) {
	g := NewWithT(t)
	c := newItemCache()
	raw := []types.ResourceWithTTL{{Resource: eds("a")}, {Resource: eds("b\xff")}, {Resource: eds("c")}}
	const nodes = 50
	got := make([][]*engine.Entry, nodes)
	errs := make([][]error, nodes)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() { got[i], errs[i] = c.ofRaws(resource.ClusterType, "1", raw, EnvoyReferences) })
	}
	wg.Wait()
	for i := range nodes {
		g.Expect(got[i][0]).To(BeIdenticalTo(got[0][0]))
		g.Expect(got[i][2]).To(BeIdenticalTo(got[0][2]))
		g.Expect(got[i][0]).NotTo(BeNil())
		g.Expect(got[i][1]).To(BeNil(), "a name that is not UTF-8 cannot be encoded")
		g.Expect(errs[i]).To(HaveLen(3))
		g.Expect(errs[i][1]).To(HaveOccurred())
	}
	g.Expect(c.making).To(BeEmpty())
}
