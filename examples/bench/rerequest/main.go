// Command rerequest measures what a zone that asks again in a tight loop costs everyone else:
// a raw delta xDS client ("looper") re-subscribes a name it holds 1,000 times a second for 10 s,
// while a real zone ("healthy") on the same global takes updates of a MeshTimeout. It prints
// the healthy zone's update latency without the loop and during it, and what the looper got:
// the global answers at most --rerequest-rate re-requests a second per stream (plus its burst)
// and counts the rest in kds_rerequests_total{result="limited"}.
//
//	go run ./examples/bench/rerequest [-rate 1000] [-for 10s] [-updates 100] [-limit 20] [-burst 40]
//
// The global runs with its defaults (owner holds on) on loopback with plaintext KDS and SQLite.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/examples/bench/internal/benchcp"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

func main() {
	rate := flag.Int("rate", 1000, "re-requests the looper sends a second")
	loop := flag.Duration("for", 10*time.Second, "how long the looper loops")
	updates := flag.Int("updates", 100, "updates of the healthy zone's MeshTimeout per phase")
	limit := flag.Float64("limit", engine.DefaultReRequestLimit().Rate, "the global's --rerequest-rate")
	burst := flag.Int("burst", engine.DefaultReRequestLimit().Burst, "the global's --rerequest-burst")
	flag.Parse()
	if err := run(*rate, *loop, *updates, engine.RateLimit{Rate: *limit, Burst: *burst}); err != nil {
		fmt.Fprintln(os.Stderr, "rerequest:", err)
		os.Exit(1)
	}
}

func run(rate int, loop time.Duration, updates int, limit engine.RateLimit) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tmp, err := os.MkdirTemp("", "kds-bench-rerequest-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	reg := resource.Default()
	gst, err := benchcp.OpenSQLite(ctx, tmp+"/global")
	if err != nil {
		return err
	}
	defer gst.Close()
	if err := benchcp.Fill(ctx, gst, []resource.Resource{benchcp.Mesh("default"), benchcp.Timeout("default", "healthy", time.Second)}, 100); err != nil {
		return err
	}
	gl, err := benchcp.StartGlobal(ctx, controlplane.GlobalConfig{Store: gst, Registry: reg, Builtin: retrypolicy.New(),
		OwnerHolds: true, Limits: engine.Limits{ReRequests: limit}, Logger: benchcp.Logger("off", "global")})
	if err != nil {
		return err
	}
	defer gl.Stop()

	// The healthy zone, and when it stored each version of the MeshTimeout.
	var mu sync.Mutex
	arrived := map[string]time.Time{}
	zst, err := benchcp.OpenSQLite(ctx, tmp+"/zone")
	if err != nil {
		return err
	}
	defer zst.Close()
	z, err := benchcp.NewZone("healthy", gl.KDSAddr(), zst, reg, benchcp.Logger("off", "zone"), zone.Config{
		Applied: func(kind string, stored []resource.Key) {
			if kind != "MeshTimeout" {
				return
			}
			r, err := zst.Get(context.Background(), resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "healthy"})
			if err == nil {
				var spec struct {
					Default struct {
						ConnectionTimeout string `json:"connectionTimeout"`
					} `json:"default"`
				}
				if json.Unmarshal(r.Spec, &spec) == nil {
					mu.Lock()
					arrived[spec.Default.ConnectionTimeout] = time.Now()
					mu.Unlock()
				}
			}
		}})
	if err != nil {
		return err
	}
	z.Start(ctx)
	defer z.Stop()
	n := 0
	measure := func() ([]time.Duration, error) {
		var lat []time.Duration
		for range updates {
			n++
			d := time.Duration(n)*time.Millisecond + time.Second
			r := benchcp.Timeout("default", "healthy", d)
			r.Generation = 0 // the store counts generations
			start := time.Now()
			if _, _, err := gst.Put(ctx, r); err != nil {
				return nil, err
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				mu.Lock()
				at, ok := arrived[d.String()]
				mu.Unlock()
				if ok {
					lat = append(lat, at.Sub(start))
					break
				}
				if time.Now().After(deadline) {
					return nil, fmt.Errorf("update %d did not reach the healthy zone within 10s", n)
				}
				time.Sleep(200 * time.Microsecond)
			}
			time.Sleep(loop / time.Duration(updates) / 2)
		}
		slices.Sort(lat)
		return lat, nil
	}
	if _, err := measure(); err != nil { // warm up: the zone's first full sync
		return err
	}
	quiet, err := measure()
	if err != nil {
		return err
	}

	// The looper: a raw delta client that ACKs everything and re-subscribes a name in a loop.
	conn, err := grpc.NewClient(gl.KDSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(sctx)
	if err != nil {
		return err
	}
	out := make(chan *discovery.DeltaDiscoveryRequest, 1024)
	var sent, received, resources atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	defer scancel()
	wg.Go(func() {
		for {
			select {
			case <-sctx.Done():
				return
			case req := <-out:
				if stream.Send(req) != nil {
					return
				}
			}
		}
	})
	wg.Go(func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			received.Add(1)
			resources.Add(int64(len(resp.GetResources())))
			select {
			case out <- &discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}:
			case <-sctx.Done():
				return
			}
		}
	})
	out <- &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "looper"}, TypeUrl: "Mesh"}
	out <- &discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout"}
	time.Sleep(500 * time.Millisecond) // subscribed, synced
	before := resources.Load()
	beforeMetrics, err := reRequests(gl.DiagAddr())
	if err != nil {
		return err
	}
	loopDone := make(chan struct{})
	wg.Go(func() {
		defer close(loopDone)
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		end := time.After(loop)
		for {
			select {
			case <-sctx.Done():
				return
			case <-end:
				return
			case <-tick.C:
				select {
				case out <- &discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout", ResourceNamesSubscribe: []string{"default/healthy"}}:
					sent.Add(1)
				default: // the sender is behind: that is the loop's own problem
				}
			}
		}
	})
	loopStart := time.Now()
	looping, err := measure()
	if err != nil {
		return err
	}
	<-loopDone
	loopFor := time.Since(loopStart)
	time.Sleep(300 * time.Millisecond)
	afterMetrics, err := reRequests(gl.DiagAddr())
	if err != nil {
		return err
	}
	answered := afterMetrics["answered"] - beforeMetrics["answered"]
	limited := afterMetrics["limited"] - beforeMetrics["limited"]

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "healthy zone's update latency\tupdates\tp50\tp99\tmax\n")
	row := func(name string, lat []time.Duration) {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\n", name, len(lat), benchcp.Ms(pct(lat, 50)), benchcp.Ms(pct(lat, 99)), benchcp.Ms(lat[len(lat)-1]))
	}
	row("no loop", quiet)
	row(fmt.Sprintf("looper at %d/s", rate), looping)
	w.Flush()
	fmt.Printf("\nratio p50 looping/no loop: %.2f; p99: %.2f\n",
		float64(pct(looping, 50))/float64(pct(quiet, 50)), float64(pct(looping, 99))/float64(pct(quiet, 99)))
	fmt.Printf("looper: %d re-requests sent in %s (%.0f/s); the global answered %.0f (%.1f/s, limit %.0f/s + burst %d) and limited %.0f; it received %d resources\n",
		sent.Load(), loopFor.Round(time.Millisecond), float64(sent.Load())/loopFor.Seconds(), answered, answered/loopFor.Seconds(),
		limit.Rate, limit.Burst, limited, resources.Load()-before)
	return nil
}

func pct(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p + 99) / 100
	return sorted[max(0, min(len(sorted)-1, i-1))]
}

// reRequests reads kds_rerequests_total by result from the global's /metrics.
func reRequests(diag string) (map[string]float64, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + diag + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "kds_rerequests_total{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		for _, result := range []string{"answered", "limited"} {
			if strings.Contains(line, `result="`+result+`"`) {
				out[result] += v
			}
		}
	}
	return out, sc.Err()
}
