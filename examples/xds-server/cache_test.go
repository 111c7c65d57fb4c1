package main

import (
	"context"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"
)

// --cache kds serves the file from kds-host's own cache: a SotW and a delta client get its
// clusters, and a change of the file reaches the SotW client.
func TestTheKDSCacheServesTheFileToSotWAndDeltaClients(t *testing.T) {
	g := NewWithT(t)
	file := t.TempDir() + "/resources.yaml"
	example := mustRead(t, "testdata/resources.yaml")
	writeFile(t, file, example)
	s := start(t, file, "--cache", "kds")
	g.Expect(s.logs.String()).To(ContainSubstring("cache=kds"))

	a := dial(t, s.xds)
	a.send(t, &discovery.DiscoveryRequest{})
	r1 := a.recv(t)
	g.Expect(clusters(t, r1)).To(HaveKey("greeter-cluster"))
	a.send(t, &discovery.DiscoveryRequest{VersionInfo: r1.GetVersionInfo(), ResponseNonce: r1.GetNonce()})
	d := dialDelta(t, s.xds, "greeter-cluster")
	var dr *discovery.DeltaDiscoveryResponse
	g.Eventually(d.resps, 10*time.Second).Should(Receive(&dr))
	g.Expect(deltaNamesOf(dr)).To(ConsistOf("greeter-cluster"))

	replaceFile(t, file, strings.Replace(example, "connect_timeout: 1s", "connect_timeout: 2s", 1))
	var r2 *discovery.DiscoveryResponse
	g.Eventually(a.resps, 10*time.Second).Should(Receive(&r2))
	g.Expect(clusters(t, r2)["greeter-cluster"].GetConnectTimeout().AsDuration()).To(Equal(2 * time.Second))
}

// --cache takes snapshot or kds, and kds only with the guard.
func TestTheCacheFlagIsChecked(t *testing.T) {
	g := NewWithT(t)
	file := t.TempDir() + "/resources.yaml"
	writeFile(t, file, mustRead(t, "testdata/resources.yaml"))
	g.Expect(run(context.Background(), []string{"--resources", file, "--cache", "linear"}, nil)).To(MatchError(`--cache "linear": want snapshot or kds`))
	g.Expect(run(context.Background(), []string{"--resources", file, "--cache", "kds", "--guard=false"}, nil)).To(MatchError(ContainSubstring("cannot be used with --guard=false")))
}

func deltaNamesOf(r *discovery.DeltaDiscoveryResponse) []string {
	var out []string
	for _, res := range r.GetResources() {
		out = append(out, res.GetName())
	}
	return out
}
