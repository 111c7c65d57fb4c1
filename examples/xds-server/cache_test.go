package main

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"
)

// --cache kds serves the file from kds-host's own cache: a SotW and a delta client get its
// clusters, and a change of the file reaches both.
func TestTheKDSCacheServesTheFileToSotWAndDeltaClients(t *testing.T) {
	servesTheFileAndItsChange(t, "kds", "--cache", "kds")
}

// servesTheFileAndItsChange starts a server with extra flags: a SotW and a delta client get the
// file's clusters, and a change of the file reaches both. It returns the server and when the
// file was changed.
func servesTheFileAndItsChange(t *testing.T, kind string, extra ...string) (*started, time.Time) {
	t.Helper()
	g := NewWithT(t)
	file := t.TempDir() + "/resources.yaml"
	example := mustRead(t, "testdata/resources.yaml")
	writeFile(t, file, example)
	s := start(t, file, extra...)
	g.Expect(s.logs.String()).To(ContainSubstring("cache=" + kind))

	a := dial(t, s.xds)
	a.send(t, &discovery.DiscoveryRequest{})
	r1 := a.recv(t)
	g.Expect(clusters(t, r1)).To(HaveKey("greeter-cluster"))
	a.send(t, &discovery.DiscoveryRequest{VersionInfo: r1.GetVersionInfo(), ResponseNonce: r1.GetNonce()})
	d := dialDelta(t, s.xds, "greeter-cluster")
	var dr *discovery.DeltaDiscoveryResponse
	g.Eventually(d.resps, 10*time.Second).Should(Receive(&dr))
	g.Expect(deltaNamesOf(dr)).To(ConsistOf("greeter-cluster"))
	changed := time.Now()

	replaceFile(t, file, strings.Replace(example, "connect_timeout: 1s", "connect_timeout: 2s", 1))
	var r2 *discovery.DiscoveryResponse
	g.Eventually(a.resps, 10*time.Second).Should(Receive(&r2))
	g.Expect(clusters(t, r2)["greeter-cluster"].GetConnectTimeout().AsDuration()).To(Equal(2 * time.Second))
	g.Eventually(d.resps, 10*time.Second).Should(Receive(&dr))
	g.Expect(deltaNamesOf(dr)).To(ConsistOf("greeter-cluster"))
	return s, changed
}

// --cache linear and mux serve the file from a LinearCache per type behind a MuxCache, through
// the guard and (--guard=false) the stock server: a SotW and a delta client get its clusters, a
// change of the file reaches both, a type the change left alone is not sent again, and /metrics
// says when the change was given to the cache and what heap the last GC found live.
func TestTheLinearAndMuxCachesServeTheFileToSotWAndDeltaClients(t *testing.T) {
	for _, kind := range []string{cacheLinear, cacheMux} {
		for _, guarded := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/guard=%t", kind, guarded), func(t *testing.T) {
				g := NewWithT(t)
				s, before := servesTheFileAndItsChange(t, kind, "--cache", kind, fmt.Sprintf("--guard=%t", guarded))
				var body string
				loadedAt := func() float64 {
					_, body = s.get(t, "/metrics")
					m := regexp.MustCompile(`(?m)^kds_xds_resources_file_loaded_timestamp_seconds (\S+)$`).FindStringSubmatch(body)
					g.Expect(m).To(HaveLen(2))
					at, err := strconv.ParseFloat(m[1], 64)
					g.Expect(err).NotTo(HaveOccurred())
					return at
				}
				// The status follows the cache's set: a client may have the change a moment before.
				g.Eventually(loadedAt, 5*time.Second).Should(BeNumerically(">=", float64(before.UnixNano())/1e9-0.001), "the change's, not the start's")
				g.Expect(body).To(ContainSubstring("go_gc_heap_live_bytes "))
				g.Expect(body).To(ContainSubstring(`kds_xds_resources_file_loaded_info{sha256=`))
			})
		}
	}
}

// The linear caches' set gives each type's LinearCache what changed of it only: a type left
// alone keeps its version, a resource gone from the file is deleted.
func TestTheLinearCachesAreGivenWhatChanged(t *testing.T) {
	g := NewWithT(t)
	l := newLinearCaches(hclog.NewNullLogger())
	res, _, err := parseResources([]byte(mustRead(t, "testdata/resources.yaml")), false)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(l.set(context.Background(), "1", res)).To(Succeed())
	clusterV, listenerV := l.byType[resource.ClusterType].GetResources(), l.byType[resource.ListenerType].GetResources()
	g.Expect(clusterV).To(HaveKey("greeter-cluster"))
	g.Expect(listenerV).To(HaveLen(1))

	res2, _, err := parseResources([]byte(strings.Replace(mustRead(t, "testdata/resources.yaml"), "connect_timeout: 1s", "connect_timeout: 2s", 1)), false)
	g.Expect(err).NotTo(HaveOccurred())
	delete(res2, resource.EndpointType)
	g.Expect(l.set(context.Background(), "2", res2)).To(Succeed())
	g.Expect(l.byType[resource.EndpointType].NumResources()).To(Equal(0))
	g.Expect(l.byType[resource.ListenerType].GetResources()["greeter.example.com:50051"]).To(BeIdenticalTo(listenerV["greeter.example.com:50051"]))
}

// --cache takes snapshot, linear, mux or kds, and kds only with the guard.
func TestTheCacheFlagIsChecked(t *testing.T) {
	g := NewWithT(t)
	file := t.TempDir() + "/resources.yaml"
	writeFile(t, file, mustRead(t, "testdata/resources.yaml"))
	g.Expect(run(context.Background(), []string{"--resources", file, "--cache", "lru"}, nil)).To(MatchError(`--cache "lru": want snapshot, linear, mux, kds`))
	g.Expect(run(context.Background(), []string{"--resources", file, "--cache", "kds", "--guard=false"}, nil)).To(MatchError(ContainSubstring("cannot be used with --guard=false")))
}

func deltaNamesOf(r *discovery.DeltaDiscoveryResponse) []string {
	var out []string
	for _, res := range r.GetResources() {
		out = append(out, res.GetName())
	}
	return out
}
