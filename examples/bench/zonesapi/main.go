// Command zonesapi measures GET /api/zones on a real global with many zone streams: it starts
// kds-host as a global (SQLite, plaintext KDS, no zone authentication) with a Mesh and a few
// policies, opens -zones delta ADS streams from this one process (100 per connection), each a
// zone subscribing to every kind and ACKing what it gets, then asks GET /api/zones as the status
// page does (the default page, a filtered page, a late page) and prints each answer's size and
// the median time of -polls of it, beside the global's CPU per poll.
//
//	go build -o bin/kds-host ./host/cmd/kds-host && go run ./examples/bench/zonesapi -bin bin/kds-host -zones 10000
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/kds-host/kds-host/examples/bench/internal/benchproc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	bin := flag.String("bin", "bin/kds-host", "the kds-host binary")
	zones := flag.Int("zones", 10_000, "zone streams")
	polls := flag.Int("polls", 20, "GET /api/zones per query measured")
	flag.StringVar(&profile, "profile", "", "write a 5 s CPU profile of the global, taken while it answers the default page, to this file")
	flag.StringVar(&idleProfile, "idleprofile", "", "write a CPU profile of the global's 10 idle seconds (every zone connected) to this file")
	flag.Parse()
	if err := run(*bin, *zones, *polls); err != nil {
		fmt.Fprintln(os.Stderr, "zonesapi:", err)
		os.Exit(1)
	}
}

var profile, idleProfile string

// fetch writes what url answers to file.
func fetch(client *http.Client, url, file string) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o644)
}

// kinds are the kinds a zone subscribes to (the default registry's, as kds-host's zone does).
var kinds = []string{"Mesh", "MeshTimeout", "MeshRetry", "MeshCircuitBreaker", "MeshHealthCheck", "MeshTrafficPermission", "MeshRateLimit", "MeshHTTPRoute"}

func run(bin string, zones, polls int) error {
	h, err := benchproc.StartHost(bin, "--max-streams-per-connection", "200", "--max-zones", strconv.Itoa(zones+10), "--diag-pprof")
	if err != nil {
		return err
	}
	defer h.Stop()
	kdsAddr, apiAddr, diagAddr := h.KDSAddr, h.APIAddr, h.DiagAddr
	client := &http.Client{Timeout: 30 * time.Second}
	tok, err := os.ReadFile(filepath.Join(h.DataDir, "admin.token"))
	if err != nil {
		return err
	}
	token := strings.TrimSpace(string(tok))
	do := func(method, path, body string) (int, []byte, error) {
		req, _ := http.NewRequest(method, "http://"+apiAddr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	if code, b, err := do(http.MethodPut, "/meshes/default", `{"type":"Mesh","name":"default"}`); err != nil || code >= 300 {
		return fmt.Errorf("write the Mesh: %d %s %v", code, b, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var acked atomic.Int64
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range zones {
		if i%100 == 0 {
			c, err := grpc.NewClient(kdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		st, err := discovery.NewAggregatedDiscoveryServiceClient(conns[len(conns)-1]).DeltaAggregatedResources(ctx)
		if err != nil {
			return err
		}
		node := &core.Node{Id: fmt.Sprintf("zone-%05d", i)}
		for _, k := range kinds {
			if err := st.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: k}); err != nil {
				return err
			}
			node = nil
		}
		wg.Go(func() {
			first := true
			for {
				r, err := st.Recv()
				if err != nil {
					return
				}
				if st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce()}) != nil {
					return
				}
				if first {
					first = false
					acked.Add(1)
				}
			}
		})
	}
	for acked.Load() < int64(zones) && time.Since(start) < 5*time.Minute {
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("%d zone streams open, %d of them ACKed their first response, in %s\n", zones, acked.Load(), time.Since(start).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	idle0 := h.CPU()
	if idleProfile != "" {
		if err := fetch(client, "http://"+diagAddr+"/debug/pprof/profile?seconds=10", idleProfile); err != nil {
			return err
		}
	} else {
		time.Sleep(10 * time.Second)
	}
	fmt.Printf("the global's idle CPU over 10 s, every zone connected: %.2f %% of a core\n\n", float64(h.CPU()-idle0)/float64(10*time.Second)*100)

	fmt.Printf("%-44s %10s %12s %14s\n", "GET", "bytes", "p50", "global CPU/poll")
	for _, q := range []string{"/api/zones", "/api/zones?state=failing", "/api/zones?zone=zone-0999", fmt.Sprintf("/api/zones?offset=%d", max(0, zones-50)), "/api/zones?limit=1000"} {
		var took []time.Duration
		var size int
		cpu0 := h.CPU()
		for range polls {
			t0 := time.Now()
			code, b, err := do(http.MethodGet, q, "")
			if err != nil || code != 200 {
				return fmt.Errorf("GET %s: %d %v", q, code, err)
			}
			took = append(took, time.Since(t0))
			size = len(b)
		}
		cpu := (h.CPU() - cpu0) / time.Duration(polls)
		slices.Sort(took)
		fmt.Printf("%-44s %10d %12s %14s\n", q, size, took[len(took)/2].Round(time.Microsecond), cpu.Round(time.Microsecond))
	}
	if profile != "" {
		done := make(chan error, 1)
		go func() {
			resp, err := client.Get("http://" + diagAddr + "/debug/pprof/profile?seconds=5")
			if err != nil {
				done <- err
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil {
				err = os.WriteFile(profile, b, 0o644)
			}
			done <- err
		}()
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
			do(http.MethodGet, "/api/zones", "")
		}
		if err := <-done; err != nil {
			return err
		}
	}
	cancel()
	return nil
}
