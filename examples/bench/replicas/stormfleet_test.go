package main

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
)

// The storm fleet's accounting: a moved zone's bytes split into what it held already at the same
// version, the probes and the rest; "in sync" compares what it holds but the probes with the
// survivors' zones; a probe is "got" once every zone on the survivors holds it.
func TestTheStormFleetCountsWhatAMovedZoneIsSent(t *testing.T) {
	var out bytes.Buffer
	f := &stormFleet{want: 2, out: bufio.NewWriter(&out), got: map[string]int{}, onSurv: 1}
	surv := &stormZone{name: "s", survivor: true, held: map[string]map[string]held{}}
	moved := &stormZone{name: "m", held: map[string]map[string]held{}}
	f.zones = []*stormZone{surv, moved}
	res := func(name, version string) *discovery.Resource {
		return &discovery.Resource{Name: "default/" + name, Version: version}
	}
	resp := func(rs ...*discovery.Resource) *discovery.DeltaDiscoveryResponse {
		return &discovery.DeltaDiscoveryResponse{TypeUrl: "MeshTimeout", Resources: rs}
	}
	t0 := time.Unix(100, 0)
	for _, z := range f.zones {
		f.apply(z, resp(res("a", "1"), res("b", "1")), t0)
	}
	if !strings.Contains(out.String(), "synced\n") {
		t.Fatalf("not synced: %q", out.String())
	}

	// The moved zone comes back holding a and b; the global changed b and wrote a probe.
	moved.moved = true
	f.apply(surv, resp(res("b", "2"), res(probePrefix+"1", "1")), t0.Add(time.Second))
	if !strings.Contains(out.String(), "got "+probePrefix+"1 ") {
		t.Errorf("the probe is not got: %q", out.String())
	}
	a, b2, p := res("a", "1"), res("b", "2"), res(probePrefix+"1", "1")
	f.apply(moved, resp(a, b2, p), t0.Add(2*time.Second))
	if moved.resent != int64(proto.Size(a)) || moved.probes != int64(proto.Size(p)) ||
		moved.sent != int64(proto.Size(a)+proto.Size(b2)+proto.Size(p)) {
		t.Errorf("sent %d, resent %d, probes %d", moved.sent, moved.resent, moved.probes)
	}
	if moved.digest != surv.digest {
		t.Errorf("the moved zone holds what the survivors' do, but for its digest")
	}

	// A removal takes the name out of the digest; the report says when it was in sync.
	f.apply(moved, &discovery.DeltaDiscoveryResponse{TypeUrl: "MeshTimeout", RemovedResources: []string{"default/a"}}, t0.Add(3*time.Second))
	f.apply(surv, &discovery.DeltaDiscoveryResponse{TypeUrl: "MeshTimeout", RemovedResources: []string{"default/a"}}, t0.Add(3*time.Second))
	out.Reset()
	if err := f.command("report"); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("moved m 0 0 %d ", t0.Add(3*time.Second).UnixNano())
	if !strings.HasPrefix(out.String(), want) || !strings.HasSuffix(out.String(), "end\n") {
		t.Errorf("report %q, want it to begin %q", out.String(), want)
	}
}

func TestRankIsTheNearestRank(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		var ds []time.Duration
		for _, v := range vs {
			ds = append(ds, time.Duration(v)*time.Millisecond)
		}
		return ds
	}
	for _, c := range []struct {
		ds   []time.Duration
		p    int
		want time.Duration
	}{
		{ms(5), 99, 5 * time.Millisecond},
		{ms(36, 204), 99, 204 * time.Millisecond},
		{ms(36, 204), 50, 36 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 90, 9 * time.Millisecond},
	} {
		if got := rank(c.ds, c.p); got != c.want {
			t.Errorf("rank(%v, %d) = %v, want %v", c.ds, c.p, got, c.want)
		}
	}
}
