package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/zone"
)

// GET /api/zones is a summary of every zone and one page of them, filtered: its size follows the
// page, not the zones (the status page polls it every second).
func TestTheZonesAnswerIsASummaryAndAPage(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	st := openSQLite(t)
	put(t, st, reg, mesh("default"))
	gl := startGlobal(t, st, reg, func(c *controlplane.GlobalConfig) { c.KDSAuth = false; c.MaxStreamsPerConnection = 200 })
	conn, err := grpc.NewClient(gl.KDSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	g.Expect(err).NotTo(HaveOccurred())
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(from, to int) {
		for i := from; i < to; i++ {
			s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			node := &core.Node{Id: fmt.Sprintf("zone-%03d", i)}
			for _, kind := range reg.Names() {
				g.Expect(s.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: kind})).To(Succeed())
				node = nil
			}
			go func() {
				for {
					if _, err := s.Recv(); err != nil {
						return
					}
				}
			}()
		}
	}
	get := func(query string) (controlplane.ZonesAnswer, int, int) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+gl.APIAddr()+"/api/zones"+query, nil)
		req.Header.Set("Authorization", "Bearer "+adminToken(t))
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var ans controlplane.ZonesAnswer
		if resp.StatusCode == http.StatusOK {
			g.Expect(json.Unmarshal(b, &ans)).To(Succeed())
		}
		return ans, resp.StatusCode, len(b)
	}

	open(0, 60)
	g.Eventually(func() int { a, _, _ := get(""); return a.Summary.Connected }, 20*time.Second).Should(Equal(60))
	_, _, size60 := get("")
	open(60, 150)
	g.Eventually(func() int { a, _, _ := get(""); return a.Summary.Connected }, 20*time.Second).Should(Equal(150))
	a, code, size150 := get("")
	g.Expect(code).To(Equal(http.StatusOK))
	g.Expect(a.Summary).To(Equal(controlplane.ZoneSummary{Zones: 150, Connected: 150}))
	g.Expect(a.Total).To(Equal(150))
	g.Expect(a.Items).To(HaveLen(controlplane.DefaultZonesLimit))
	g.Expect(a.Items[0].Zone).To(Equal("zone-000"))
	g.Expect(a.Items[0].Kinds).NotTo(BeEmpty(), "a page's zones come with their kinds")
	g.Expect(size150).To(BeNumerically("<=", size60+size60/10), "the answer follows the page, not the zones")
	g.Expect(size150).To(BeNumerically("<", 256<<10))

	a, _, _ = get("?offset=140")
	g.Expect(a.Items).To(HaveLen(10))
	g.Expect(a.Items[0].Zone).To(Equal("zone-140"))
	a, _, _ = get("?zone=zone-12&limit=5")
	g.Expect(a.Total).To(Equal(10))
	g.Expect(a.Items).To(HaveLen(5))
	a, _, _ = get("?state=disconnected")
	g.Expect(a.Total).To(BeZero())
	g.Expect(a.Summary.Zones).To(Equal(150), "the summary counts every zone, whatever the filter")
	for _, bad := range []string{"?state=sleepy", "?limit=0", "?limit=1001", "?offset=-1", "?offset=x"} {
		_, code, _ := get(bad)
		g.Expect(code).To(Equal(http.StatusBadRequest), bad)
	}
}

// GET /api/zones shows a zone, its kinds and its stream's retry state in kds-host's words, under
// the keys they always had ("zone", "kinds", "kind"), whatever the library's insight and retry
// state call them (node, types, type URL).
func TestTheZonesAnswerKeepsItsKeys(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	gl := startGlobal(t, gst, reg, func(c *controlplane.GlobalConfig) {
		c.Builtin = policyOf(t, "policy: fixed\ndelay: 20ms\ninvalidAttempts: 3\n")
	})
	zst := openSQLite(t)
	startZone(t, "zone-1", gl.KDSAddr(), zst, reg, func(c *zone.Config) {
		c.AdmissionDeny = map[string]string{"deny": "true"}
	})
	g.Eventually(count(zst, "Mesh", ""), 10*time.Second).Should(Equal(1))
	bad := timeout("default", "bad", "3s")
	bad.Labels = map[string]string{"deny": "true"}
	put(t, gst, reg, bad)

	type object = map[string]any
	var item, retry, failing object
	parked := func() int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+gl.APIAddr()+"/api/zones", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken(t))
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		var ans struct{ Items []object }
		if json.NewDecoder(resp.Body).Decode(&ans) != nil || len(ans.Items) == 0 {
			return 0
		}
		item = ans.Items[0]
		retry, _ = item["retry"].(object)
		list, _ := retry["failing"].([]any)
		if len(list) == 0 {
			return 0
		}
		failing, _ = list[0].(object)
		names, _ := failing["parked"].([]any)
		return len(names)
	}
	g.Eventually(parked, 10*time.Second).Should(Equal(1))

	keys := func(o object) []string { return slices.Sorted(maps.Keys(o)) }
	g.Expect(item).To(HaveKeyWithValue("zone", "zone-1"))
	g.Expect(keys(item)).To(ContainElements("zone", "connected", "stream", "since", "kinds", "replica", "retry"))
	g.Expect(keys(item)).To(HaveEach(BeElementOf("zone", "connected", "stream", "since", "kinds", "replica", "replicaAddress",
		"heartbeat", "retry", "withheld", "withheldTotal", "held", "retryWithheld")))
	kinds := map[any]object{} // by "kind"
	list, _ := item["kinds"].([]any)
	for _, k := range list {
		o, _ := k.(object)
		g.Expect(keys(o)).To(ContainElements("kind", "sent", "responses", "acks", "nacks", "known"))
		g.Expect(keys(o)).To(HaveEach(BeElementOf("kind", "sent", "responses", "acks", "nacks", "lastError", "rejected", "withheld", "known", "held")))
		kinds[o["kind"]] = o
	}
	g.Expect(kinds).To(HaveKey("Mesh"))
	g.Expect(kinds).To(HaveKeyWithValue("MeshTimeout", HaveKeyWithValue("rejected", ConsistOf(HaveKeyWithValue("name", "default/bad")))))
	g.Expect(kinds["MeshTimeout"]).To(HaveKey("lastError"))
	g.Expect(retry).To(HaveKeyWithValue("zone", "zone-1"))
	g.Expect(keys(retry)).To(ContainElements("stream", "zone", "round", "failing"))
	g.Expect(keys(retry)).To(HaveEach(BeElementOf("stream", "zone", "round", "lastDelay", "nextRetry", "givenUp", "reason", "failing")))
	g.Expect(keys(failing)).To(ConsistOf("kind", "rejected", "parked", "nacks", "firstNack", "held"))
	g.Expect(failing).To(HaveKeyWithValue("kind", "MeshTimeout"))
	want := map[string]any{"kind": "MeshTimeout", "name": "default/bad",
		"reason": "the client refused this content as invalid 3 times; parked until it changes"}
	g.Expect(failing).To(HaveKeyWithValue("parked", ConsistOf(want)))
	g.Expect(failing).To(HaveKeyWithValue("held", ConsistOf(want)), "the deprecated JSON field is still emitted")
}
