// Command slowzones measures what zones that stop reading cost a healthy zone: it starts kds-host
// as a global (its own process: SQLite, plaintext KDS, no zone authentication), stores a Mesh and
// a kind of -kind-mb MB (MeshAccessLogs of 2 MB each), syncs a healthy zone (in this process,
// with a store of its own), and then opens -slow streams as other zones that subscribe to the big
// kind over the smallest flow-control windows and never read (each ACKs the Mesh first, as a zone
// does, so that owner holds send it the mesh's policies). Then it writes -writes small
// MeshRetries on the global, one at a time, and times each from the write's request to the moment
// the healthy zone has stored it. It prints, per number of slow zones (0 is the baseline, in the
// same run): each write's latency, their median and largest, the global's RSS, and how many of the
// slow zones' connections the global dropped once -hold passed (its --kds-response-timeout).
//
//	make build && go run ./examples/bench/slowzones -bin bin/kds-host
//	go run ./examples/bench/slowzones -bin bin/kds-host -slow 0,5,50 -kind-mb 80 -writes 5
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kds-host/kds-host/examples/bench/internal/benchcp"
	"github.com/kds-host/kds-host/examples/bench/internal/benchproc"
	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/zone"
)

type options struct {
	bin     string
	slow    []int
	kindMB  int
	writes  int
	hold    time.Duration
	timeout time.Duration
	flags   []string
}

func main() {
	var o options
	var slow, flags string
	flag.StringVar(&o.bin, "bin", "bin/kds-host", "the kds-host binary")
	flag.StringVar(&slow, "slow", "0,5,50", "numbers of zones that stop reading, one run each (0: the baseline)")
	flag.IntVar(&o.kindMB, "kind-mb", 80, "MB of the kind the slow zones subscribe to")
	flag.IntVar(&o.writes, "writes", 5, "small writes of another kind, one at a time")
	flag.DurationVar(&o.hold, "hold", 35*time.Second, "how long the slow zones stay after the writes, to see the global close them")
	flag.DurationVar(&o.timeout, "write-timeout", 30*time.Second, "how long a write may take to reach the healthy zone before the run fails")
	flag.StringVar(&flags, "global-flags", "", "more flags for the global, space-separated (e.g. --kds-response-timeout=10s)")
	flag.Parse()
	for _, s := range strings.Split(slow, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			fmt.Fprintf(os.Stderr, "slowzones: -slow %q: want numbers of zones\n", slow)
			os.Exit(2)
		}
		o.slow = append(o.slow, n)
	}
	o.flags = strings.Fields(flags)
	fmt.Printf("slowzones: kind %d MB, %d writes, hold %s, global flags %q\n\n", o.kindMB, o.writes, o.hold, o.flags)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "slow zones\twrite latencies (ms)\tp50 (ms)\tmax (ms)\tglobal RSS after the writes\tglobal peak RSS\tslow zones' connections after the hold\t")
	for _, n := range o.slow {
		r, err := run(o, n)
		if err != nil {
			fmt.Fprintln(os.Stderr, "slowzones:", err)
			os.Exit(1)
		}
		lat := make([]string, len(r.latencies))
		for i, d := range r.latencies {
			lat[i] = fmt.Sprintf("%.0f", ms(d))
		}
		sorted := slices.Sorted(slices.Values(r.latencies))
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.0f\t%s\t%s\t%s\t\n", n, strings.Join(lat, ", "), ms(sorted[len(sorted)/2]), ms(sorted[len(sorted)-1]),
			benchcp.MiB(r.rss), benchcp.MiB(r.hwm), r.ended)
		fmt.Fprintf(os.Stderr, "slowzones: %d slow zones done\n", n)
	}
	tw.Flush()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

type result struct {
	latencies []time.Duration
	rss, hwm  uint64
	ended     string
}

func run(o options, slow int) (result, error) {
	var res result
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h, err := benchproc.StartHost(o.bin, o.flags...)
	if err != nil {
		return res, err
	}
	defer h.Stop()
	tok, err := os.ReadFile(filepath.Join(h.DataDir, "admin.token"))
	if err != nil {
		return res, err
	}
	cl := &api.Client{BaseURL: "http://" + h.APIAddr, Token: strings.TrimSpace(string(tok)), HTTPClient: &http.Client{Timeout: time.Minute}}
	reg := resource.Default()
	put := func(kind, mesh, name string, spec string) error {
		k, ok := reg.Lookup(kind)
		if !ok {
			return fmt.Errorf("no kind %s", kind)
		}
		doc, _ := json.Marshal(map[string]any{"spec": json.RawMessage(spec)})
		_, _, err := cl.Put(ctx, k, mesh, name, doc)
		return err
	}
	if err := put("Mesh", "", "default", `{}`); err != nil {
		return res, fmt.Errorf("put the mesh: %w", err)
	}
	const each = 2_000_000
	n := max(o.kindMB*1_000_000/each, 1)
	for i := range n {
		pad := strings.Repeat(string(rune('a'+i%26)), each)
		if err := put("MeshAccessLog", "default", fmt.Sprintf("big-%03d", i), fmt.Sprintf(`{"targetRef":{"kind":"MeshSubset","tags":{"pad":%q}}}`, pad)); err != nil {
			return res, fmt.Errorf("put a big MeshAccessLog: %w", err)
		}
	}

	// The healthy zone, synced before the slow ones come.
	dir, err := os.MkdirTemp("", "slowzones-zone-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	zst, err := benchcp.OpenSQLite(ctx, dir)
	if err != nil {
		return res, err
	}
	defer zst.Close()
	var mu sync.Mutex
	arrived := map[string]chan time.Time{}
	expect := func(name string) chan time.Time {
		mu.Lock()
		defer mu.Unlock()
		if arrived[name] == nil {
			arrived[name] = make(chan time.Time, 1)
		}
		return arrived[name]
	}
	bigs := make(chan struct{}, n)
	z, err := benchcp.NewZone("healthy", h.KDSAddr, zst, reg, benchcp.Logger("error", "zone"), zone.Config{
		Applied: func(kind string, stored []resource.Key) {
			now := time.Now()
			for _, k := range stored {
				switch kind {
				case "MeshRetry":
					select {
					case expect(k.Name) <- now:
					default:
					}
				case "MeshAccessLog":
					bigs <- struct{}{}
				}
			}
		},
	})
	if err != nil {
		return res, err
	}
	z.Start(ctx)
	defer z.Stop()
	for range n {
		select {
		case <-bigs:
		case <-time.After(5 * time.Minute):
			return res, errors.New("the healthy zone did not sync the big kind within 5 minutes")
		}
	}

	// The slow zones: a connection each, the smallest windows, and never a read.
	var ends sync.Map
	var wg sync.WaitGroup
	for i := range slow {
		conn, err := grpc.NewClient(h.KDSAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithStaticStreamWindowSize(64<<10), grpc.WithStaticConnWindowSize(64<<10))
		if err != nil {
			return res, err
		}
		defer conn.Close()
		str, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
		if err != nil {
			return res, err
		}
		// As a zone: the Mesh first, ACKed (owner holds send a mesh's policies to a zone that
		// holds the mesh), then the big kind, never read.
		node := &core.Node{Id: fmt.Sprintf("slow-%03d", i)}
		if err := str.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: "Mesh", ResourceNamesSubscribe: []string{"*"}}); err != nil {
			return res, err
		}
		for {
			r, err := str.Recv()
			if err != nil {
				return res, fmt.Errorf("slow zone %d: %w", i, err)
			}
			if err := str.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce}); err != nil {
				return res, err
			}
			if r.TypeUrl == "Mesh" {
				break
			}
		}
		if err := str.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: "MeshAccessLog", ResourceNamesSubscribe: []string{"*"}}); err != nil {
			return res, err
		}
		// Its end is seen by its connection leaving READY (the global dropped it): it never
		// reads, nor asks again.
		wg.Go(func() {
			for ctx.Err() == nil && conn.GetState() == connectivity.Ready {
				conn.WaitForStateChange(ctx, connectivity.Ready)
			}
			if ctx.Err() == nil {
				ends.Store(i, time.Now())
			}
		})
	}
	time.Sleep(3 * time.Second) // the global hands the slow zones what fits

	for i := range o.writes {
		name := fmt.Sprintf("w-%d", i)
		ch := expect(name)
		start := time.Now()
		if err := put("MeshRetry", "default", name, `{"targetRef":{"kind":"Mesh"}}`); err != nil {
			return res, fmt.Errorf("put a MeshRetry: %w", err)
		}
		select {
		case at := <-ch:
			res.latencies = append(res.latencies, at.Sub(start))
		case <-time.After(o.timeout):
			return res, fmt.Errorf("write %d did not reach the healthy zone within %s", i, o.timeout)
		}
	}
	if res.rss, res.hwm, err = benchcp.ProcStatusOf(strconv.Itoa(h.Pid())); err != nil {
		return res, err
	}
	if slow > 0 {
		time.Sleep(o.hold)
		dropped := 0
		ends.Range(func(_, _ any) bool {
			dropped++
			return true
		})
		res.ended = fmt.Sprintf("%d dropped, %d open", dropped, slow-dropped)
	} else {
		res.ended = "-"
	}
	cancel()
	wg.Wait()
	return res, nil
}
