package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/kds-host/kds-host/examples/bench/internal/benchcp"
	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/resource"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// fleetProc is the zones' process. It prints "synced" once every stream holds the seed, then
// "got NAME UNIXNANO" when every stream holds a resource named NAME; the storm's prints other
// lines too (other).
type fleetProc struct {
	*benchcp.Fleet
	mu    sync.Mutex
	got   map[string]time.Time
	other []string      // the lines other than "got", in order
	cond  chan struct{} // closed and replaced at every line
	err   error

	closeOnce sync.Once
	closeErr  error
}

func (b *bench) startFleet(perReplica map[string]int, prefix string) (*fleetProc, error) {
	var lines []string
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range perReplica {
			if !yield(id) {
				return
			}
		}
	}) {
		for i := range perReplica[id] {
			name := fmt.Sprintf("%s-%s-%04d", prefix, strings.ToLower(id), i)
			tok, err := b.keys.Issue(auth.Claims{Kind: auth.KindZone, Name: name}, time.Hour, time.Now())
			if err != nil {
				return nil, err
			}
			lines = append(lines, b.replicas[id].kds+" "+tok+" "+name)
		}
	}
	b.seq++
	file := filepath.Join(b.tmp, fmt.Sprintf("fleet-%d", b.seq))
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		return nil, err
	}
	fl, err := benchcp.StartFleet("-fleet", file)
	if err != nil {
		return nil, err
	}
	return newFleetProc(fl), nil
}

// newFleetProc reads fl's lines until it ends.
func newFleetProc(fl *benchcp.Fleet) *fleetProc {
	f := &fleetProc{Fleet: fl, got: map[string]time.Time{}, cond: make(chan struct{})}
	go func() {
		for {
			line, err := fl.Out.ReadString('\n')
			f.mu.Lock()
			if err != nil {
				f.err = fmt.Errorf("the zones' process: %w", err)
			} else if fs := strings.Fields(line); len(fs) == 3 && fs[0] == "got" {
				ns, _ := strconv.ParseInt(fs[2], 10, 64)
				f.got[fs[1]] = time.Unix(0, ns)
			} else {
				f.other = append(f.other, strings.TrimSpace(line))
			}
			close(f.cond)
			f.cond = make(chan struct{})
			f.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return f
}

// ask sends the process a command line and returns the lines other than "got" that it prints
// up to the first that begins with last, within timeout.
func (f *fleetProc) ask(command, last string, timeout time.Duration) ([]string, error) {
	f.mu.Lock()
	from := len(f.other)
	f.mu.Unlock()
	if err := f.Send(command); err != nil {
		return nil, err
	}
	deadline := time.After(timeout)
	for {
		f.mu.Lock()
		lines, cond, err := f.other[from:], f.cond, f.err
		f.mu.Unlock()
		for i, l := range lines {
			if strings.HasPrefix(l, last) {
				return slices.Clone(lines[:i+1]), nil
			}
		}
		if err != nil {
			return nil, err
		}
		select {
		case <-cond:
		case <-deadline:
			return nil, fmt.Errorf("the zones' process did not answer %q within %s", command, timeout)
		}
	}
}

// wait returns when every stream has ACKed the resource named name.
func (f *fleetProc) wait(name string, timeout time.Duration) (time.Time, error) {
	deadline := time.After(timeout)
	for {
		f.mu.Lock()
		at, ok := f.got[name]
		cond, err := f.cond, f.err
		f.mu.Unlock()
		switch {
		case ok:
			return at, nil
		case err != nil:
			return time.Time{}, err
		}
		select {
		case <-cond:
		case <-deadline:
			return time.Time{}, fmt.Errorf("not every stream got %s within %s", name, timeout)
		}
	}
}

// close stops the process, once: later calls return what the first did.
func (f *fleetProc) close() error {
	f.closeOnce.Do(func() { f.closeErr = f.Close() })
	return f.closeErr
}

// perConn is how many zone streams share one connection (a global allows 16).
const perConn = 8

// runFleet is the zones' process: one raw delta xDS stream per line of file, every kind
// subscribed, everything ACKed.
func runFleet(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	type zoneLine struct{ addr, token, name string }
	var zs []zoneLine
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 {
			zs = append(zs, zoneLine{f[0], f[1], f[2]})
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	want := len(seed())
	var mu sync.Mutex
	acked := map[string]int{} // resource name -> streams that ACKed it
	synced := 0
	out := bufio.NewWriter(os.Stdout)
	errs := make(chan error, len(zs))
	var wg sync.WaitGroup
	conns := map[string]*grpc.ClientConn{}
	count := map[string]int{}
	kinds := resource.Default().Names()
	for _, z := range zs {
		if count[z.addr]%perConn == 0 {
			c, err := grpc.NewClient(z.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return err
			}
			defer c.Close()
			conns[z.addr] = c
		}
		count[z.addr]++
		cc := conns[z.addr]
		wg.Go(func() {
			sctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+z.token)
			s, err := discovery.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(sctx)
			if err != nil {
				errs <- err
				return
			}
			node := &core.Node{Id: z.name}
			for _, k := range kinds {
				if err := s.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: k}); err != nil {
					errs <- err
					return
				}
				node = nil
			}
			n := 0
			for {
				resp, err := s.Recv()
				if err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("%s: %w", z.name, err)
					}
					return
				}
				now := time.Now()
				mu.Lock()
				before := n
				n += len(resp.GetResources())
				if before < want && n >= want {
					if synced++; synced == len(zs) {
						fmt.Fprintln(out, "synced")
						out.Flush()
					}
				}
				if before >= want {
					for _, r := range resp.GetResources() {
						_, name, _ := strings.Cut(r.GetName(), "/")
						if acked[name]++; acked[name] == len(zs) {
							fmt.Fprintf(out, "got %s %d\n", name, now.UnixNano())
							out.Flush()
						}
					}
				}
				mu.Unlock()
				if s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}) != nil {
					return
				}
			}
		})
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	select {
	case err := <-errs:
		cancel()
		wg.Wait()
		return err
	case <-ctx.Done():
	}
	wg.Wait()
	return nil
}
