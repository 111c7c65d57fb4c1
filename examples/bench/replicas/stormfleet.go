package main

import (
	"bufio"
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/zone"
)

// probePrefix begins the names of the storm's latency probes (the writes timed to the zones on
// the surviving replicas): the fleet counts their bytes apart, and leaves them out of what "in
// sync" compares, so that a write timed during the storm is not a change the moved zones
// "should not have been sent".
const probePrefix = "probe-"

// The storm fleet's timing, host/zone's: a zone's reconnect backoff starts at backoffMin after a
// healthy stream and doubles, up to backoffMax, with every round of addresses that all failed;
// a stream whose header (the global's store id, sent once the stream is served) has not come
// within headerTimeout is given up.
const (
	backoffMin    = 100 * time.Millisecond
	backoffMax    = 5 * time.Second
	headerTimeout = 30 * time.Second
	syncTimeout   = 5 * time.Minute // the whole fleet's first sync
)

// held is a resource a zone holds: its version and the bytes it came in.
type held struct {
	version string
	size    int
}

// mark is a moved zone's state at a time: what it held (stormZone.digest) once a response was
// applied and ACKed, or once its new stream was served.
type mark struct {
	at     time.Time
	digest uint64
}

// stormZone is one zone of the storm's fleet: a raw delta xDS client that resumes as a kds-host
// zone does (host/zone): a new stream declares what it holds, per type, in
// initial_resource_versions, and goes to the next address after a jittered backoff.
type stormZone struct {
	name, token string
	addrs       []string // its home replica's first
	survivor    bool     // its home is not the replica the storm kills

	// The rest is the fleet's mu's.
	held   map[string]map[string]held // type -> name -> what it holds
	digest uint64                     // of held but the probes: what "in sync" compares
	count  int                        // resources held but the probes
	first  int64                      // bytes of the first stream's resources but the probes
	last   error                      // the last stream's end

	moved    bool      // its first stream ended
	ended    time.Time // when
	served   time.Time // when a stream after it was served (its header came)
	trail    []mark    // after the move
	sent     int64     // bytes of resources sent after the move
	resent   int64     // of them, resources it held already at the same version
	probes   int64     // of them, the latency probes
	attempts int       // streams opened after the move
	refused  int       // of them, refused (Unavailable) by the arrival bound
}

// stormFleet is the storm's zones' process.
type stormFleet struct {
	zones  []*stormZone
	victim string // the address of the replica the storm kills
	kinds  []string
	want   int // resources a zone holds once synced, but the probes

	mu     sync.Mutex
	out    *bufio.Writer
	synced int
	got    map[string]int // probe -> zones on the survivors that hold it
	onSurv int            // zones on the survivors
	conns  map[string][]*grpc.ClientConn
}

// runStormFleet is the storm's zones' process: one zone per line of file (NAME TOKEN ADDRS,
// the addresses comma-separated, its home's first). It prints "synced" once every zone holds
// the seed, "got NAME UNIXNANO" when every zone whose home is not victim holds the probe NAME,
// and answers the lines "status" and "report" of its standard input (stormFleet.command).
func runStormFleet(file, victim string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	f := &stormFleet{victim: victim, kinds: resource.Default().Names(), want: len(seed()),
		out: bufio.NewWriter(os.Stdout), got: map[string]int{}, conns: map[string][]*grpc.ClientConn{}}
	for _, l := range strings.Split(string(b), "\n") {
		if fs := strings.Fields(l); len(fs) == 3 {
			z := &stormZone{name: fs[0], token: fs[1], addrs: strings.Split(fs[2], ","), held: map[string]map[string]held{}}
			z.survivor = z.addrs[0] != victim
			if z.survivor {
				f.onSurv++
			}
			f.zones = append(f.zones, z)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i, z := range f.zones {
		wg.Go(func() { f.keep(ctx, i, z) })
	}
	commands := make(chan string)
	// The reader of standard input is not waited for: a read of it cannot be interrupted, and it
	// ends when the parent closes it or with this process, which exits once this returns (an
	// error returned here must not wait for the parent, which waits for this process's output).
	go func() {
		defer cancel() // standard input closed: stop
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			select {
			case commands <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	syncBy := time.NewTimer(syncTimeout)
	defer syncBy.Stop()
	for err == nil {
		select {
		case <-ctx.Done():
			wg.Wait()
			f.closeConns()
			return nil
		case <-syncBy.C:
			f.mu.Lock()
			if f.synced < len(f.zones) {
				err = fmt.Errorf("%d of %d zones synced within %s", f.synced, len(f.zones), syncTimeout)
				for _, z := range f.zones {
					if z.count < f.want {
						err = fmt.Errorf("%w; %s holds %d resources of %d, its last stream ended with %v", err, z.name, z.count, f.want, z.last)
						break
					}
				}
			}
			f.mu.Unlock()
		case c := <-commands:
			err = f.command(c)
		}
	}
	cancel()
	wg.Wait()
	f.closeConns()
	return err
}

// command answers a line of the parent's:
//
//   - "status": "status MOVED EXPECTED SERVED INSYNC AGREE REF LOST": how many zones of the
//     victim lost their stream, of the EXPECTED; how many of them a new stream serves, and hold
//     what the zones on the survivors hold (INSYNC); whether those all hold the same (AGREE:
//     1 or 0), REF (hex) being its digest; LOST, the zones on the survivors whose stream ended;
//   - "report": a line "moved NAME ENDED SERVED SYNC FULL FIRST SENT RESENT PROBES ATTEMPTS
//     REFUSED" for each moved zone (times in Unix nanoseconds, SYNC 0 when it does not hold what
//     the survivors' zones hold; FULL the bytes of what it holds but the probes, FIRST those of
//     its first stream's resources), then "end".
func (f *stormFleet) command(c string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	ref, agree := f.reference()
	switch c {
	case "status":
		moved, expected, served, inSync, lost := 0, 0, 0, 0, 0
		for _, z := range f.zones {
			if z.survivor {
				if z.moved {
					lost++
				}
				continue
			}
			expected++
			if !z.moved {
				continue
			}
			moved++
			if !z.served.IsZero() {
				served++
				if z.digest == ref {
					inSync++
				}
			}
		}
		a := 0
		if agree {
			a = 1
		}
		fmt.Fprintf(f.out, "status %d %d %d %d %d %x %d\n", moved, expected, served, inSync, a, ref, lost)
	case "report":
		for _, z := range f.zones {
			if z.survivor || !z.moved {
				continue
			}
			var sync time.Time
			if z.digest == ref {
				// The first mark from which it held what the survivors' zones hold.
				for i, m := range z.trail {
					if m.digest == ref && (i == 0 || z.trail[i-1].digest != ref) {
						sync = m.at
					}
				}
			}
			full := int64(0)
			for _, byName := range z.held {
				for n, h := range byName {
					if !isProbe(n) {
						full += int64(h.size)
					}
				}
			}
			fmt.Fprintf(f.out, "moved %s %d %d %d %d %d %d %d %d %d %d\n", z.name, unixNano(z.ended), unixNano(z.served), unixNano(sync),
				full, z.first, z.sent, z.resent, z.probes, z.attempts, z.refused)
		}
		fmt.Fprintln(f.out, "end")
	default:
		return fmt.Errorf("the storm fleet: unknown command %q", c)
	}
	return f.out.Flush()
}

// reference is the digest of what the zones on the survivors hold (the first of them's), and
// whether they all hold the same. Call with mu held.
func (f *stormFleet) reference() (uint64, bool) {
	var ref uint64
	seen := false
	for _, z := range f.zones {
		if !z.survivor {
			continue
		}
		if !seen {
			ref, seen = z.digest, true
		} else if z.digest != ref {
			return ref, false
		}
	}
	return ref, seen
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// keep keeps zone i connected until ctx ends, as host/zone's Client.Run does: each address in
// turn, a jittered backoff between streams that starts short after a healthy stream and doubles
// with every round of addresses that all failed. Only its first stream keeps to its home
// address until served, so that the fleet starts spread evenly however it was admitted.
func (f *stormFleet) keep(ctx context.Context, i int, z *stormZone) {
	backoff := backoffMin
	next, failed := 0, 0
	placed := false // a stream to its home served it: until then it tries its home only
	for {
		addr := z.addrs[next]
		next = (next + 1) % len(z.addrs)
		began := time.Now()
		served, err := f.session(ctx, i, z, addr)
		if ctx.Err() != nil {
			return
		}
		f.mu.Lock()
		z.last = err
		switch {
		case !placed && !served:
			// Refused before the storm (the fleet arriving under the arrival bound): the
			// zones stay spread evenly, each on its home.
			next = 0
		case !placed:
			placed = true
			z.moved, z.ended = true, time.Now()
		case status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "arriving at once"):
			z.refused++
		}
		f.mu.Unlock()
		if served && time.Since(began) > time.Second {
			backoff, failed = backoffMin, 0
		} else if failed++; failed >= len(z.addrs) {
			backoff, failed = min(backoff*2, backoffMax), 0
		}
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// conn is zone i's connection to addr: perConn zones share one, created when first needed.
func (f *stormFleet) conn(i int, addr string) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cs := f.conns[addr]
	if cs == nil {
		cs = make([]*grpc.ClientConn, (len(f.zones)+perConn-1)/perConn)
		f.conns[addr] = cs
	}
	if cs[i/perConn] == nil {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithStaticStreamWindowSize(zone.Window), grpc.WithStaticConnWindowSize(zone.Window))
		if err != nil {
			return nil, err
		}
		cs[i/perConn] = c
	}
	return cs[i/perConn], nil
}

func (f *stormFleet) closeConns() {
	for _, cs := range f.conns {
		for _, c := range cs {
			if c != nil {
				c.Close()
			}
		}
	}
}

// session runs one stream of z to addr until it ends; served says whether the global served
// it (its header came).
func (f *stormFleet) session(ctx context.Context, i int, z *stormZone, addr string) (served bool, err error) {
	conn, err := f.conn(i, addr)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f.mu.Lock()
	if z.moved {
		z.attempts++
	}
	initial := map[string]map[string]string{}
	for kind, byName := range z.held {
		initial[kind] = map[string]string{}
		for n, h := range byName {
			initial[kind][n] = h.version
		}
	}
	f.mu.Unlock()
	sctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+z.token)
	giveUp := time.AfterFunc(headerTimeout, cancel) // the stream open, the subscriptions, the header
	defer giveUp.Stop()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(sctx)
	if err != nil {
		return false, err
	}
	node := &core.Node{Id: z.name}
	for _, kind := range f.kinds {
		if err := s.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: kind, InitialResourceVersions: initial[kind]}); err != nil {
			_, err = s.Recv() // the stream's end says why
			return false, err
		}
		node = nil
	}
	md, _ := s.Header()
	if !giveUp.Stop() {
		return false, fmt.Errorf("%s: no header from %s within %s", z.name, addr, headerTimeout)
	}
	if len(md.Get(zone.StoreIDHeader)) == 0 {
		_, err := s.Recv() // refused, or ended: its status says why
		return false, err
	}
	f.mu.Lock()
	if z.moved {
		z.served = time.Now()
		z.trail = append(z.trail, mark{z.served, z.digest})
	}
	f.mu.Unlock()
	for {
		resp, err := s.Recv()
		if err != nil {
			return true, err
		}
		f.apply(z, resp, time.Now())
		if err := s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
			return true, err
		}
	}
}

// apply records a response z received at now (and ACKs right after).
func (f *stormFleet) apply(z *stormZone, resp *discovery.DeltaDiscoveryResponse, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	kind := resp.GetTypeUrl()
	byName := z.held[kind]
	if byName == nil {
		byName = map[string]held{}
		z.held[kind] = byName
	}
	before := z.count
	for _, r := range resp.GetResources() {
		size := proto.Size(r)
		old, had := byName[r.GetName()]
		probe := isProbe(r.GetName())
		switch {
		case !z.moved:
			if !probe {
				z.first += int64(size)
			}
		case had && old.version == r.GetVersion():
			z.sent += int64(size)
			z.resent += int64(size)
		case probe:
			z.sent += int64(size)
			z.probes += int64(size)
		default:
			z.sent += int64(size)
		}
		byName[r.GetName()] = held{r.GetVersion(), size}
		if probe {
			if !had && z.survivor {
				if f.got[r.GetName()]++; f.got[r.GetName()] == f.onSurv {
					fmt.Fprintf(f.out, "got %s %d\n", shortName(r.GetName()), now.UnixNano())
					f.out.Flush()
				}
			}
			continue
		}
		if had {
			z.digest ^= digestOf(kind, r.GetName(), old.version)
		} else {
			z.count++
		}
		z.digest ^= digestOf(kind, r.GetName(), r.GetVersion())
	}
	for _, n := range resp.GetRemovedResources() {
		if old, had := byName[n]; had {
			delete(byName, n)
			if !isProbe(n) {
				z.digest ^= digestOf(kind, n, old.version)
				z.count--
			}
		}
	}
	if z.moved {
		z.trail = append(z.trail, mark{now, z.digest})
	}
	if before < f.want && z.count >= f.want {
		if f.synced++; f.synced == len(f.zones) {
			fmt.Fprintln(f.out, "synced")
			f.out.Flush()
		}
	}
}

// shortName is a resource's name without its mesh (the xDS name is MESH/NAME).
func shortName(n string) string { return n[strings.LastIndex(n, "/")+1:] }

func isProbe(n string) bool { return strings.HasPrefix(shortName(n), probePrefix) }

// digestOf is a held resource's share of a zone's digest (the XOR of its resources').
func digestOf(kind, name, version string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write([]byte(version))
	return h.Sum64()
}
