package guard

import (
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A RawResponse's resource is encoded once for every node given the same message at the same
// version; a message changed in place under a new version is encoded again, and its entry says
// so; the same content under another version is the same entry.
func TestARawResourceIsEncodedOnceAVersion(t *testing.T) {
	g := NewWithT(t)
	c := newItemCache()
	m := eds("a")
	e1, err := c.ofRaw(resource.ClusterType, "1", m, EnvoyReferences)
	g.Expect(err).NotTo(HaveOccurred())
	m.ConnectTimeout = durationpb.New(5e9) // changed in place: a cache that serves it again at "1" breaks its own contract
	again, err := c.ofRaw(resource.ClusterType, "1", m, EnvoyReferences)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again).To(BeIdenticalTo(e1), "the same message at the same version: not encoded again")

	e2, err := c.ofRaw(resource.ClusterType, "2", m, EnvoyReferences)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(e2).NotTo(BeIdenticalTo(e1))
	g.Expect(e2.Version).NotTo(Equal(e1.Version), "its new content, under the new version")

	same, err := c.ofRaw(resource.ClusterType, "3", eds("a"), EnvoyReferences)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(same).To(BeIdenticalTo(e1), "another message of the same content: the same entry")
}
