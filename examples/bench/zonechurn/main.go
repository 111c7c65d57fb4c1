// Command zonechurn measures what zones that come and go leave behind on a global: N zones,
// each with its own minted zone token, open their KDS streams (one per zone, every kind
// subscribed, everything ACKed), then close them, C times over, after one warm-up cycle. After
// each cycle, and once the zones' grace period is over, it forces a GC and reads the live heap,
// which must come back to where it was before the first cycle. (The warm-up is there because
// the Go runtime keeps, for reuse, the descriptor of every goroutine it ever made: the first
// 2,000 streams leave those behind, whatever the program does; the table shows them.) With M zones connected it also reads GET /api/zones and
// prints its size.
//
//	go run ./examples/bench/zonechurn [-zones 2000] [-cycles 5] [-api-zones 1000]
//
// The global runs with its defaults (owner holds on, zone tokens required) in this process, on
// loopback with plaintext KDS and SQLite; the zones are raw delta xDS clients, not zone control
// planes (2,000 SQLite stores would measure SQLite), in a child process of this program, so that
// the heap measured is the global's alone.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
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
	"google.golang.org/grpc/metadata"

	"github.com/kds-host/kds-host/examples/bench/internal/benchcp"
	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

func main() {
	zones := flag.Int("zones", 2000, "zones that connect and leave in each cycle")
	cycles := flag.Int("cycles", 5, "cycles")
	apiZones := flag.Int("api-zones", 1000, "zones connected while GET /api/zones is read")
	grace := flag.Duration("grace", 200*time.Millisecond, "the global's --zone-grace")
	heapProfile := flag.String("heapprofile", "", "write a heap profile here after the last cycle")
	fleetAddr := flag.String("fleet", "", "internal: be the zones' process, against this KDS address")
	tokensFile := flag.String("tokens", "", "internal: the zones' tokens, one a line")
	want := flag.Int64("want", 0, "internal: resources each zone must hold")
	flag.Parse()
	if *fleetAddr != "" {
		if err := runFleet(*fleetAddr, *tokensFile, *want); err != nil {
			fmt.Fprintln(os.Stderr, "zonechurn fleet:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*zones, *cycles, *apiZones, *grace, *heapProfile); err != nil {
		fmt.Fprintln(os.Stderr, "zonechurn:", err)
		os.Exit(1)
	}
}

// perConn is how many zone streams share one connection (the global allows 16).
const perConn = 8

func run(zones, cycles, apiZones int, grace time.Duration, heapProfile string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tmp, err := os.MkdirTemp("", "kds-bench-zonechurn-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	reg := resource.Default()
	st, err := benchcp.OpenSQLite(ctx, tmp)
	if err != nil {
		return err
	}
	defer st.Close()
	rs := append([]resource.Resource{benchcp.Mesh("default")}, resource.MeshDefaults("default")...)
	for i := range 20 {
		rs = append(rs, benchcp.Timeout("default", fmt.Sprintf("t-%d", i), time.Second))
	}
	if err := benchcp.Fill(ctx, st, rs, 100); err != nil {
		return err
	}
	keys, err := auth.NewKeys()
	if err != nil {
		return err
	}
	gl, err := benchcp.StartGlobal(ctx, controlplane.GlobalConfig{Store: st, Registry: reg, Builtin: retrypolicy.New(),
		OwnerHolds: true, Keys: keys, KDSAuth: true, ZoneGrace: grace, Logger: benchcp.Logger("off", "global")})
	if err != nil {
		return err
	}
	defer gl.Stop()
	admin, err := keys.Issue(auth.Claims{Kind: auth.KindUser, Name: "admin", Groups: []string{auth.GroupAdmin}}, 0, time.Now())
	if err != nil {
		return err
	}
	tokens := make([]string, max(zones, apiZones))
	for i := range tokens {
		if tokens[i], err = keys.Issue(auth.Claims{Kind: auth.KindZone, Name: fmt.Sprintf("zone-%04d", i)}, time.Hour, time.Now()); err != nil {
			return err
		}
	}
	want := int64(len(rs)) // resources each zone must hold

	heap := func() uint64 {
		for range 3 {
			runtime.GC()
		}
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	settle := func() { time.Sleep(grace + grace/2 + 200*time.Millisecond) } // the grace, and the expiry tick after it

	cycle := func() (time.Duration, error) {
		start := time.Now()
		child, err := startFleet(gl.KDSAddr(), tokens[:zones], want, tmp)
		if err != nil {
			return 0, err
		}
		took := time.Since(start)
		if err := child.Close(); err != nil {
			return 0, err
		}
		deadline := time.Now().Add(time.Minute)
		for len(gl.ZoneViews()) != 0 { // every stream closed, and every zone's grace over
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("%d zones still in the table a minute after they left", len(gl.ZoneViews()))
			}
			time.Sleep(50 * time.Millisecond)
		}
		settle()
		return took, nil
	}

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "cycle\tzones\tconnect+sync\tlive heap after\tvs before cycle 1\t\n")
	settle()
	empty := heap()
	fmt.Fprintf(w, "empty global\t-\t-\t%s\t\t\n", benchcp.MiB(empty))
	took, err := cycle() // warm-up: the runtime keeps the goroutine descriptors it made for reuse
	if err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	before := heap()
	fmt.Fprintf(w, "warm-up\t%d\t%s\t%s\t\t\n", zones, took.Round(time.Millisecond), benchcp.MiB(before))
	var last uint64
	for c := 1; c <= cycles; c++ {
		took, err := cycle()
		if err != nil {
			return fmt.Errorf("cycle %d: %w", c, err)
		}
		last = heap()
		fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%+.1f%%\t\n", c, zones, took.Round(time.Millisecond), benchcp.MiB(last), 100*(float64(last)/float64(before)-1))
	}
	w.Flush()
	if heapProfile != "" {
		f, err := os.Create(heapProfile)
		if err != nil {
			return err
		}
		runtime.GC()
		if err := pprof.WriteHeapProfile(f); err != nil {
			return err
		}
		f.Close()
	}

	child, err := startFleet(gl.KDSAddr(), tokens[:apiZones], want, tmp)
	if err != nil {
		return err
	}
	size, err := apiSize("http://"+gl.APIAddr()+"/api/zones", admin)
	if cerr := child.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	fmt.Printf("\nlive heap after %d cycles of %d zones: %s, %+.1f%% of %s before the first cycle\n",
		cycles, zones, benchcp.MiB(last), 100*(float64(last)/float64(before)-1), benchcp.MiB(before))
	fmt.Printf("(the warm-up's %s over the empty global's %s is the Go runtime's goroutine descriptors, kept for reuse, never freed: -heapprofile shows them under runtime.malg)\n",
		benchcp.MiB(before-empty), benchcp.MiB(empty))
	fmt.Printf("GET /api/zones with %d zones connected: %d bytes (%.2f MB)\n", apiZones, size, float64(size)/1e6)
	return nil
}

// startFleet starts the zones' process (runFleet): it prints "synced" once every zone holds
// everything, and closes every stream and exits when its standard input closes.
func startFleet(addr string, tokens []string, want int64, tmp string) (*benchcp.Fleet, error) {
	file := filepath.Join(tmp, "tokens")
	if err := os.WriteFile(file, []byte(strings.Join(tokens, "\n")), 0o600); err != nil {
		return nil, err
	}
	return benchcp.StartFleet("-fleet", addr, "-tokens", file, "-want", strconv.FormatInt(want, 10))
}

// runFleet is the zones' process.
func runFleet(addr, tokensFile string, want int64) error {
	b, err := os.ReadFile(tokensFile)
	if err != nil {
		return err
	}
	tokens := strings.Split(string(b), "\n")
	f, err := connect(context.Background(), addr, tokens, resource.Default().Names(), want)
	if err != nil {
		return err
	}
	fmt.Println("synced")
	_, _ = io.Copy(io.Discard, os.Stdin)
	f.close()
	return nil
}

// fleet is a set of zone streams.
type fleet struct {
	cancel context.CancelFunc
	conns  []*grpc.ClientConn
	wg     sync.WaitGroup
}

func (f *fleet) close() {
	f.cancel()
	f.wg.Wait()
	for _, c := range f.conns {
		c.Close()
	}
}

// connect opens a stream per token, subscribes every kind, ACKs everything, and returns once
// every zone holds want resources.
func connect(ctx context.Context, addr string, tokens, kinds []string, want int64) (*fleet, error) {
	ctx, cancel := context.WithCancel(ctx)
	f := &fleet{cancel: cancel}
	var synced atomic.Int64
	errs := make(chan error, len(tokens))
	var conn *grpc.ClientConn
	for i, tok := range tokens {
		if i%perConn == 0 {
			c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				f.close()
				return nil, err
			}
			conn = c
			f.conns = append(f.conns, c)
		}
		cc := conn
		name := fmt.Sprintf("zone-%04d", i)
		f.wg.Go(func() {
			sctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
			s, err := discovery.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(sctx)
			if err != nil {
				errs <- err
				return
			}
			node := &core.Node{Id: name}
			for _, k := range kinds {
				if err := s.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: k}); err != nil {
					errs <- err
					return
				}
				node = nil
			}
			var acked int64 // resources received and ACKed
			for {
				resp, err := s.Recv()
				if err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("%s: %w", name, err)
					}
					return
				}
				before := acked
				acked += int64(len(resp.GetResources()))
				if before < want && acked >= want {
					synced.Add(1)
				}
				if s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}) != nil {
					return
				}
			}
		})
	}
	deadline := time.Now().Add(5 * time.Minute)
	for synced.Load() < int64(len(tokens)) {
		select {
		case err := <-errs:
			f.close()
			return nil, err
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			f.close()
			return nil, fmt.Errorf("only %d of %d zones synced within 5 minutes", synced.Load(), len(tokens))
		}
	}
	return f, nil
}

func apiSize(url, token string) (int, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /api/zones: %s", resp.Status)
	}
	return len(b), err
}
