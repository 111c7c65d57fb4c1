// Command namesflood measures what a zone stream that subscribes to made-up names costs a real
// global: it starts kds-host as a global (SQLite, plaintext KDS, no zone authentication), opens
// delta ADS streams as one zone and subscribes to -names made-up names in requests of -batch,
// opening a new stream whenever the global refuses one (--kds-max-unknown-names), and then prints
// the global's live heap and peak RSS beside the same figures before the flood.
//
//	go build -o bin/kds-host ./host/cmd/kds-host && go run ./examples/bench/namesflood -bin bin/kds-host
//	go run ./examples/bench/namesflood -bin bin/kds-host -limit 100000000   # the bound off
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
	names := flag.Int("names", 6_000_000, "made-up names to subscribe to in all")
	batch := flag.Int("batch", 50_000, "names per request")
	limit := flag.Int("limit", 0, "the global's --kds-max-unknown-names (0: its default); a limit above -names shows the flood without the bound")
	flag.Parse()
	if err := run(*bin, *names, *batch, *limit); err != nil {
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
