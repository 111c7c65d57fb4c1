package engine

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/engine/event"
)

// perStreamKey is the guard's kind of node key: the node id and the stream id.
func perStreamKey(id int64, node string) string { return node + "/" + strconv.FormatInt(id, 10) }

// With a node key (Tracker.SetNodeKey), a stream is admitted as the key of its stream id and node
// id, not as its node id: two streams are one node, the newer replacing the older, when their
// keys are equal, and two nodes side by side when they differ, whatever their node ids. The
// cache's current session of a node, a node's own snapshot and the node the observers are told
// of all follow the key; a closed stream ends its key's session only.
func TestSessionsAreKeptByTheirNodeKey(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sotw     bool
		key      func(streamID int64, node string) string // nil: none set
		nodes    [2]string                                // the node ids streams 1 and 2 send
		keys     [2]string                                // the nodes they are admitted as
		replaced bool                                     // stream 2 replaces stream 1
	}{
		{name: "without a key, a node's second stream replaces its first",
			nodes: [2]string{"n", "n"}, keys: [2]string{"n", "n"}, replaced: true},
		{name: "a key a stream serves one node's streams side by side", key: perStreamKey,
			nodes: [2]string{"n", "n"}, keys: [2]string{"n/1", "n/2"}},
		{name: "a SotW stream's key is made of its negated id", sotw: true, key: perStreamKey,
			nodes: [2]string{"n", "n"}, keys: [2]string{"n/-1", "n/-2"}},
		{name: "streams without a node id are admitted by their keys", key: perStreamKey,
			nodes: [2]string{"", ""}, keys: [2]string{"/1", "/2"}},
		{name: "one key for two node ids is one node", key: func(int64, string) string { return "k" },
			nodes: [2]string{"n", "m"}, keys: [2]string{"k", "k"}, replaced: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := NewWithT(t)
				c := NewCache([]string{resourcev3.ClusterType})
				c.UseNodeSnapshots()
				defer c.Close()
				var opened, refused, closedNodes []string
				tr := NewTracker(c, event.Observer{
					StreamOpened: func(_ int64, node string) { opened = append(opened, node) },
					StreamClosed: func(_ int64, node string) { closedNodes = append(closedNodes, node) },
					Refused:      func(r event.Refusal) { refused = append(refused, r.Reason+" "+r.Node) },
				})
				if tc.key != nil {
					tr.SetNodeKey(tc.key)
				}
				ended := make(chan error, 1) // stream 1's end, as its replacement closes it
				ctx := context.WithValue(context.Background(), streamKey{}, &streamInfo{close: func(err error) { ended <- err }})
				cls := [2]*testClient{openClientCtx(t, ctx, c, tr, 1, tc.nodes[0], tc.sotw), openClient(t, c, tr, 2, tc.nodes[1], tc.sotw)}
				for _, cl := range cls {
					g.Expect(cl.ask(resourcev3.ClusterType, nil, "")).To(Succeed())
				}

				g.Expect(opened).To(Equal(tc.keys[:]), "the observers are told of the keys")
				for i, cl := range cls {
					g.Expect(cl.session().Node()).To(Equal(tc.keys[i]), "stream %d", i+1)
				}
				for _, n := range tc.nodes {
					if !slices.Contains(tc.keys[:], n) {
						g.Expect(c.Current(n)).To(BeNil(), "node id %q is no node of the cache", n)
					}
				}
				g.Expect(c.Current(tc.keys[1])).To(BeIdenticalTo(cls[1].session()))
				if tc.replaced {
					g.Expect(ended).To(Receive(WithTransform(status.Code, Equal(codes.Aborted))), "stream 1 is replaced")
					g.Expect(refused).To(Equal([]string{"replaced " + tc.keys[1]}))
				} else {
					g.Expect(ended).NotTo(Receive())
					g.Expect(refused).To(BeEmpty())
					g.Expect(c.Current(tc.keys[0])).To(BeIdenticalTo(cls[0].session()))
				}

				// A node's own snapshot is its key's: it reaches that key's current stream alone.
				c.SetNodeSnapshot(tc.keys[1], SnapshotOf([]*Entry{clusterEntry(t, "two", "1")}))
				r := cls[1].take(resourcev3.ClusterType)
				g.Expect(r).NotTo(BeNil())
				g.Expect(r.names).To(Equal([]string{"two"}))
				g.Expect(cls[0].take(resourcev3.ClusterType)).To(BeNil())
				if !tc.replaced {
					c.SetNodeSnapshot(tc.keys[0], SnapshotOf([]*Entry{clusterEntry(t, "one", "1")}))
					r := cls[0].take(resourcev3.ClusterType)
					g.Expect(r).NotTo(BeNil())
					g.Expect(r.names).To(Equal([]string{"one"}))
					g.Expect(cls[1].take(resourcev3.ClusterType)).To(BeNil())
				}

				// Stream 1 closes: its key's session ends, unless it was replaced; stream 2's stays.
				cls[0].close()
				g.Expect(c.Current(tc.keys[1])).To(BeIdenticalTo(cls[1].session()))
				if !tc.replaced {
					g.Expect(c.Current(tc.keys[0])).To(BeNil())
				}
				g.Expect(closedNodes).To(Equal([]string{tc.keys[0]}))
			})
		})
	}
}

// The key is what is admitted: it is bounded as a node id is, must not be empty, and for a
// stream whose credentials name its node it must be that node.
func TestAStreamIsAdmittedAsItsNodeKey(t *testing.T) {
	for _, tc := range []struct {
		name  string
		creds string // the node the stream's credentials name ("": none)
		key   string // what the key function returns for node id "n"
		code  codes.Code
	}{
		{name: "a key within the bound", key: strings.Repeat("k", 253), code: codes.OK},
		{name: "a key over the bound", key: strings.Repeat("k", 254), code: codes.InvalidArgument},
		{name: "an empty key", key: "", code: codes.InvalidArgument},
		{name: "the node its credentials name", creds: "n/1", key: "n/1", code: codes.OK},
		{name: "another node than its credentials name", creds: "n", key: "n/1", code: codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := NewWithT(t)
				c := NewCache([]string{resourcev3.ClusterType})
				defer c.Close()
				tr := NewTracker(c)
				var asked []string
				tr.SetNodeKey(func(id int64, node string) string {
					asked = append(asked, perStreamKey(id, node))
					return tc.key
				})
				ctx := context.WithValue(context.Background(), streamKey{}, &streamInfo{node: tc.creds, close: func(error) {}})
				cl := openClientCtx(t, ctx, c, tr, 1, "n", false)
				err := cl.ask(resourcev3.ClusterType, nil, "")
				g.Expect(status.Code(err)).To(Equal(tc.code), "%v", err)
				g.Expect(asked).To(Equal([]string{"n/1"}), "the key function is given the stream id and node id")
				if tc.code == codes.OK {
					g.Expect(c.Current(tc.key)).To(BeIdenticalTo(cl.session()))
				} else {
					g.Expect(cl.session().Node()).To(BeEmpty(), "not admitted")
				}
			})
		})
	}
}
