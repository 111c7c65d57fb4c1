// Command namesflood measures what a zone stream's made-up inputs cost a real global: it starts
// kds-host as a global (SQLite, plaintext KDS) and floods it as one zone, by -mode:
//
//   - names (the default; no zone authentication): opens delta ADS streams and subscribes to
//     -names made-up names in requests of -batch, opening a new stream whenever the global
//     refuses one (--kds-max-unknown-names), and prints the global's live heap and peak RSS
//     beside the same figures before the flood.
//
//   - initial (bounds.go; a zone token): opens -rounds streams, each sending one first request
//     with -initial made-up initial_resource_versions (each version -version), one after another
//     (or all at once: -parallel), and prints each stream's status and the global's RSS and peak
//     RSS.
//
//   - types (a zone token): sends -types made-up type URLs, -batch a stream, and prints the
//     streams' statuses and the global's RSS and peak RSS.
//
//   - unauthenticated: opens streams without a token for -for, and prints how many lines and
//     bytes the global logged about them.
//
//     go build -o bin/kds-host ./host/cmd/kds-host && go run ./examples/bench/namesflood -bin bin/kds-host
//     go run ./examples/bench/namesflood -bin bin/kds-host -limit 100000000   # the bound off
//     go run ./examples/bench/namesflood -bin bin/kds-host -mode initial -rounds 5 -initial 500000
//     go run ./examples/bench/namesflood -bin bin/kds-host -mode types -types 200000 -batch 1000
//     go run ./examples/bench/namesflood -bin bin/kds-host -mode unauthenticated -for 5s
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/kds-host/kds-host/examples/bench/internal/benchproc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func main() {
	bin := flag.String("bin", "bin/kds-host", "the kds-host binary")
	mode := flag.String("mode", "names", "names, initial, types or unauthenticated")
	names := flag.Int("names", 6_000_000, "names: made-up names to subscribe to in all")
	batch := flag.Int("batch", 50_000, "names: names per request; types: type URLs per stream")
	limit := flag.Int("limit", 0, "names: the global's --kds-max-unknown-names (0: its default); a limit above -names shows the flood without the bound")
	rounds := flag.Int("rounds", 5, "initial: streams, one first request each")
	initial := flag.Int("initial", 500_000, "initial: made-up initial_resource_versions a request")
	version := flag.String("version", "0123456789abcdef", "initial: the version of each (16 hex digits, as a kds-host zone's)")
	parallel := flag.Bool("parallel", false, "initial: send the streams' requests all at once")
	types := flag.Int("types", 200_000, "types: made-up type URLs in all")
	duration := flag.Duration("for", 5*time.Second, "unauthenticated: how long to open streams")
	flag.Parse()
	var err error
	switch *mode {
	case "names":
		err = run(*bin, *names, *batch, *limit)
	case "initial":
		err = floodInitial(*bin, *rounds, *initial, *version, *parallel)
	case "types":
		err = floodTypes(*bin, *types, *batch)
	case "unauthenticated":
		err = floodUnauthenticated(*bin, *duration)
	default:
		err = fmt.Errorf("-mode %q: want names, initial, types or unauthenticated", *mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "namesflood:", err)
		os.Exit(1)
	}
}

func run(bin string, total, batch, limit int) error {
	var flags []string
	if limit > 0 {
		flags = append(flags, "--kds-max-unknown-names", strconv.Itoa(limit))
	}
	h, err := benchproc.StartHost(bin, flags...)
	if err != nil {
		return err
	}
	defer h.Stop()
	kdsAddr := h.KDSAddr
	heap0, rss0 := measure(h)

	conn, err := grpc.NewClient(kdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	sent, streams, refused := 0, 0, 0
	var lastRefusal string
	start := time.Now()
	for sent < total {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
		if err != nil {
			cancel()
			return err
		}
		streams++
		ended := make(chan error, 1)
		go func() {
			for {
				if _, err := st.Recv(); err != nil {
					ended <- err
					return
				}
			}
		}()
		node := &core.Node{Id: "zone-flood"}
		refusedHere := false
	stream:
		for sent < total {
			req := &discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: "MeshTimeout", ResourceNamesSubscribe: make([]string, 0, batch)}
			node = nil
			for i := range batch {
				req.ResourceNamesSubscribe = append(req.ResourceNamesSubscribe, fmt.Sprintf("made-up/name-%09d", sent+i))
			}
			if err := st.Send(req); err != nil {
				break
			}
			sent += batch
			select {
			case err := <-ended:
				refusedHere, lastRefusal = true, status.Convert(err).Message()
				break stream
			case <-time.After(20 * time.Millisecond):
			}
		}
		if !refusedHere { // the send failed: the stream's end says why
			select {
			case err := <-ended:
				refusedHere, lastRefusal = true, status.Convert(err).Message()
			case <-time.After(time.Second):
			}
		}
		if refusedHere {
			refused++
		}
		cancel()
	}
	took := time.Since(start)
	time.Sleep(time.Second)
	heap1, rss1 := measure(h)
	fmt.Printf("%d made-up names in requests of %d over %d streams in %s; %d streams refused (%q)\n\n",
		sent, batch, streams, took.Round(time.Millisecond), refused, lastRefusal)
	fmt.Printf("%-22s %12s %12s\n", "global", "live heap", "peak RSS")
	fmt.Printf("%-22s %9.1f MB %9.1f MB\n", "before the flood", heap0/1e6, rss0/1e6)
	fmt.Printf("%-22s %9.1f MB %9.1f MB\n", "after the flood", heap1/1e6, rss1/1e6)
	return nil
}

// measure reads the global's live heap (go_memstats_heap_inuse_bytes) and its peak RSS (VmHWM).
func measure(h *benchproc.Host) (heap, rss float64) {
	if resp, err := http.Get("http://" + h.DiagAddr + "/metrics"); err == nil {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_heap_inuse_bytes "); ok {
				heap, _ = strconv.ParseFloat(v, 64)
			}
		}
		resp.Body.Close()
	}
	return heap, h.PeakRSS()
}
