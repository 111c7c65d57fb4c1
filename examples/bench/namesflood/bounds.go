package main

// The modes that flood a global with zone authentication on: a zone's initial versions, its type
// URLs, and streams without a token.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kds-host/kds-host/examples/bench/internal/benchproc"
)

// floodZone is the zone every stream claims, with a token of its own.
const floodZone = "zone-flood"

// logTally counts the lines and bytes the global logs, and how many lines hold a word.
type logTally struct {
	mu           sync.Mutex
	lines, bytes int
	refused      int // lines that say a KDS stream was refused
	left         int // lines that say how many refusals were not logged
	last         string
}

func (l *logTally) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.bytes += len(p)
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		l.lines++
		switch {
		case bytes.Contains(line, []byte("more not logged")):
			l.left++
		case bytes.Contains(line, []byte("KDS stream refused")):
			l.refused++
			l.last = string(line)
		}
	}
	return len(p), nil
}

func (l *logTally) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprintf("%d lines, %d bytes (%d 'KDS stream refused', %d 'more not logged')", l.lines, l.bytes, l.refused, l.left)
}

// startAuthenticated starts a global that requires zone tokens, logging at WARN into logs, and
// mints a token for floodZone on its API.
func startAuthenticated(bin string, logs io.Writer) (*benchproc.Host, string, error) {
	h, err := benchproc.StartHostLogging(bin, logs, "--kds-auth", "token", "--log-level", "warn")
	if err != nil {
		return nil, "", err
	}
	out, err := exec.Command(bin, "token", "zone", "--name", floodZone, "--cp", "http://"+h.APIAddr, "--data-dir", h.DataDir).Output()
	if err != nil {
		h.Stop()
		return nil, "", fmt.Errorf("mint a zone token: %w", err)
	}
	return h, strings.TrimSpace(string(out)), nil
}

func dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
}

// stream is one delta stream of floodZone and what its reader saw first: a response, or its end.
type stream struct {
	discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	first  chan string // "answered: ..." or "ended CODE: message"
	cancel context.CancelFunc
}

func openStream(conn *grpc.ClientConn, token string) (*stream, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	s := &stream{AggregatedDiscoveryService_DeltaAggregatedResourcesClient: st, first: make(chan string, 1), cancel: cancel}
	go func() {
		said := false
		for {
			r, err := st.Recv()
			if err != nil {
				if !said {
					st := status.Convert(err)
					s.first <- fmt.Sprintf("ended %s: %s", st.Code(), st.Message())
				}
				return
			}
			if !said {
				said = true
				s.first <- fmt.Sprintf("answered: %d resources, %d removed", len(r.Resources), len(r.RemovedResources))
			}
		}
	}()
	return s, nil
}

// outcome waits up to d for what the stream saw first ("no answer" after d).
func (s *stream) outcome(d time.Duration) string {
	select {
	case o := <-s.first:
		return o
	case <-time.After(d):
		return "no answer within " + d.String()
	}
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

// floodInitial opens rounds streams of one zone, each sending one first request with n made-up
// initial_resource_versions, one after another (or all at once, parallel), and prints each one's
// outcome and the global's memory.
func floodInitial(bin string, rounds, n int, version string, parallel bool) error {
	logs := &logTally{}
	h, token, err := startAuthenticated(bin, logs)
	if err != nil {
		return err
	}
	defer h.Stop()
	conn, err := dial(h.KDSAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	versions := make(map[string]string, n)
	for i := range n {
		versions[fmt.Sprintf("made-up/name-%09d", i)] = version
	}
	req := &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: floodZone}, TypeUrl: "MeshTimeout", InitialResourceVersions: versions}
	rss0, hwm0 := h.RSS(), h.PeakRSS()
	fmt.Printf("%d streams of zone %q (parallel: %v), each one request of %d initial_resource_versions (version %q, %.1f MiB encoded)\n\n",
		rounds, floodZone, parallel, n, version, float64(proto.Size(req))/(1<<20))
	fmt.Printf("%-6s %-12s %-12s %s\n", "stream", "RSS", "peak RSS", "outcome")
	fmt.Printf("%-6s %-12s %-12s\n", "before", mib(rss0), mib(hwm0))
	var open []*stream
	defer func() {
		for _, s := range open {
			s.cancel()
		}
	}()
	if parallel {
		// Every stream sends at once, and the global reads them side by side.
		for range rounds {
			s, err := openStream(conn, token)
			if err != nil {
				return err
			}
			open = append(open, s)
		}
		var wg sync.WaitGroup
		for _, s := range open {
			wg.Go(func() { _ = s.Send(req) })
		}
		wg.Wait()
	}
	for r := 1; r <= rounds; r++ {
		if !parallel {
			s, err := openStream(conn, token)
			if err != nil {
				return err
			}
			open = append(open, s) // an answered stream stays open until the next replaces it
			if err := s.Send(req); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
		}
		o := open[r-1].outcome(time.Minute)
		time.Sleep(500 * time.Millisecond)
		fmt.Printf("%-6d %-12s %-12s %s\n", r, mib(h.RSS()), mib(h.PeakRSS()), shorten(o, 160))
	}
	time.Sleep(2 * time.Second)
	rss, hwm := h.RSS(), h.PeakRSS()
	fmt.Printf("%-6s %-12s %-12s\n\n", "after", mib(rss), mib(hwm))
	fmt.Printf("RSS grew by %s, peak RSS by %s\n", mib(rss-rss0), mib(hwm-hwm0))
	fmt.Printf("kds_stream_refusals_total: %s\n", refusals(h))
	fmt.Printf("the global logged %s\n", logs)
	return nil
}

// floodTypes sends total made-up type URLs, batch a stream (each stream's first request names
// the zone), and prints the outcomes and the global's memory.
func floodTypes(bin string, total, batch int) error {
	logs := &logTally{}
	h, token, err := startAuthenticated(bin, logs)
	if err != nil {
		return err
	}
	defer h.Stop()
	conn, err := dial(h.KDSAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	rss0, hwm0 := h.RSS(), h.PeakRSS()
	sent, streams := 0, 0
	outcomes := map[string]int{}
	var open []*stream
	defer func() {
		for _, s := range open {
			s.cancel()
		}
	}()
	start := time.Now()
	for sent < total {
		s, err := openStream(conn, token)
		if err != nil {
			return err
		}
		streams++
		open = append(open, s)
		node := &core.Node{Id: floodZone}
		for i := 0; i < batch && sent < total; i++ {
			if err := s.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: fmt.Sprintf("type.googleapis.com/made.up.T%07d", sent)}); err != nil {
				break // the global ended the stream
			}
			node = nil
			sent++
		}
		o, _, _ := strings.Cut(s.outcome(2*time.Second), ": ") // by code: each names its type URL
		outcomes[o]++
	}
	took := time.Since(start)
	time.Sleep(2 * time.Second)
	rss, hwm := h.RSS(), h.PeakRSS()
	fmt.Printf("%d made-up type URLs, %d a stream, over %d streams in %s\n\n", sent, batch, streams, took.Round(time.Millisecond))
	keys := make([]string, 0, len(outcomes))
	for k := range outcomes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Printf("%6d streams: %s\n", outcomes[k], k)
	}
	fmt.Printf("\n%-8s %-12s %-12s\n", "global", "RSS", "peak RSS")
	fmt.Printf("%-8s %-12s %-12s\n", "before", mib(rss0), mib(hwm0))
	fmt.Printf("%-8s %-12s %-12s\n", "after", mib(rss), mib(hwm))
	fmt.Printf("RSS grew by %s, peak RSS by %s\n", mib(rss-rss0), mib(hwm-hwm0))
	fmt.Printf("kds_stream_refusals_total: %s\n", refusals(h))
	fmt.Printf("the global logged %s\n", logs)
	return nil
}

// floodUnauthenticated opens streams without a token, one after another, for d, and prints how
// much the global logged about them.
func floodUnauthenticated(bin string, d time.Duration) error {
	logs := &logTally{}
	h, _, err := startAuthenticated(bin, logs)
	if err != nil {
		return err
	}
	defer h.Stop()
	conn, err := dial(h.KDSAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	streams := 0
	outcomes := map[string]int{}
	for end := time.Now().Add(d); time.Now().Before(end); {
		s, err := openStream(conn, "")
		if err != nil {
			return err
		}
		_ = s.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: floodZone}, TypeUrl: "MeshTimeout"})
		outcomes[shorten(s.outcome(10*time.Second), 60)]++
		s.cancel()
		streams++
	}
	time.Sleep(1500 * time.Millisecond) // the last window's count of what it left out
	fmt.Printf("%d streams without a token in %s\n", streams, d)
	for k, n := range outcomes {
		fmt.Printf("%6d streams: %s\n", n, k)
	}
	fmt.Printf("kds_stream_refusals_total: %s\n", refusals(h))
	fmt.Printf("the global logged %s\n", logs)
	logs.mu.Lock()
	fmt.Printf("a refusal's line: %s (%d bytes)\n", logs.last, len(logs.last)+1)
	logs.mu.Unlock()
	return nil
}

// refusals reads kds_stream_refusals_total's non-zero series from the global's /metrics.
func refusals(h *benchproc.Host) string {
	resp, err := http.Get("http://" + h.DiagAddr + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "kds_stream_refusals_total{"); ok && !strings.HasSuffix(v, " 0") {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return "{" + strings.Join(out, ", {")
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
