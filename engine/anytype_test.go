package engine

import (
	"testing"
	"testing/synctest"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A type URL that is not one of the cache's own is refused, InvalidArgument with the message
// that names what the cache serves, unless the cache serves any type (ServeAnyType, as the
// guard's does): then it is served as the cache's own types are, its first answer and a write's.
func TestATypeTheCacheWasNotMadeForIsServedOnlyWhenItServesAnyType(t *testing.T) {
	const other = resourcev3.ClusterType // the cache is made for Listeners only
	for _, tc := range []struct {
		name    string
		sotw    bool
		anyType bool
		refusal string // the request's error message ("": served)
		second  []string
	}{
		{name: "delta, refused", refusal: `type_url "` + other + `" is not a kind this control plane serves (it serves ` + resourcev3.ListenerType + `)`},
		{name: "sotw, refused", sotw: true, refusal: `type_url "` + other + `" is not a type this server serves (it serves ` + resourcev3.ListenerType + `)`},
		{name: "delta, served", anyType: true, second: []string{"a"}},
		{name: "sotw, served", sotw: true, anyType: true, second: []string{"a", "b"}}, // Clusters: the full state
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := NewWithT(t)
				c := NewCache([]string{resourcev3.ListenerType})
				if tc.anyType {
					c.ServeAnyType()
				}
				defer c.Close()
				tr := NewTracker(c)
				c.SetSnapshot(SnapshotOf([]*Entry{clusterEntry(t, "a", "1"), clusterEntry(t, "b", "1")}))
				cl := openClient(t, c, tr, 1, "node-1", tc.sotw)

				err := cl.ask(other, nil, "")
				if tc.refusal != "" {
					g.Expect(status.Code(err)).To(Equal(codes.InvalidArgument))
					g.Expect(status.Convert(err).Message()).To(Equal(tc.refusal))
					g.Expect(c.Current("node-1")).To(BeNil(), "a refused first request admits no node")
					return
				}
				g.Expect(err).NotTo(HaveOccurred())
				first := cl.ackAll(other, nil)
				g.Expect(first).NotTo(BeNil(), "the type's first answer")
				g.Expect(first.names).To(Equal([]string{"a", "b"}))

				c.SetSnapshot(c.Snapshot().Update([]*Entry{clusterEntry(t, "a", "2")}, nil))
				next := cl.take(other)
				g.Expect(next).NotTo(BeNil(), "a write of the type reaches its watch")
				g.Expect(next.names).To(Equal(tc.second))
				v, ok := cl.session().AckedVersion(other, "b")
				g.Expect([]any{v, ok}).To(Equal([]any{"1", true}), "its ACK is read as a served type's")
			})
		})
	}
}
