package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/examples/bench/internal/benchproc"
	"github.com/kds-host/kds-host/examples/bench/internal/fleetproc"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/zone"
)

// fleetConfig is what the zones' process is told on its command line.
type fleetConfig struct {
	addr           string
	zones          int
	resources      int    // MeshTimeouts each zone must hold, and the Mesh
	tokensFile     string // a zone token per line; empty: no tokens (the stock server)
	updates        int    // updates the driver will make (warm-up included)
	streamsPerConn int
	sotw           bool   // state-of-the-world streams (StreamAggregatedResources) instead of delta
	defaultWindows bool   // grpc-go's default (dynamic) flow-control windows instead of a zone's fixed ones
	cpuProfile     string // where to write the zones' process's CPU profile, from start to exit
}

// The zones' process prints, on its standard output:
//
//	progress ZONES RESOURCES     every 2 s until synced: zones holding everything, resources ACKed
//	synced NANOSECONDS           every zone holds everything, NANOSECONDS after the first dial
//	reached SEQ UNIXNANO         every zone holds update SEQ, since the wall clock's UNIXNANO
//
// and closes every stream and exits once its standard input closes. A stream that fails while
// it runs ends the process with an error.
func runFleet(cfg fleetConfig) error {
	if cfg.cpuProfile != "" {
		pf, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var tokens []string
	if cfg.tokensFile != "" {
		b, err := os.ReadFile(cfg.tokensFile)
		if err != nil {
			return err
		}
		tokens = strings.Fields(string(b))
		if len(tokens) < cfg.zones {
			return fmt.Errorf("%s holds %d tokens for %d zones", cfg.tokensFile, len(tokens), cfg.zones)
		}
	}
	f := &fleet{cfg: cfg, codec: newFrameCodec(), reached: make([]atomic.Int64, cfg.updates)}
	f.remaining.Store(int64(cfg.zones))
	f.start = time.Now()
	dial := func() (*grpc.ClientConn, error) {
		opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256 << 20))}
		if !cfg.defaultWindows {
			// Windows fixed as a kds-host zone's (and Envoy's): no bandwidth-delay PINGs after
			// each response, which every server would have to read and answer.
			opts = append(opts, grpc.WithStaticStreamWindowSize(zone.Window),
				grpc.WithStaticConnWindowSize(int32(min(int64(cfg.streamsPerConn)*zone.Window, math.MaxInt32))))
		}
		return grpc.NewClient(cfg.addr, opts...)
	}
	stream := func(ctx context.Context, cc *grpc.ClientConn, i int) error {
		token := ""
		if tokens != nil {
			token = tokens[i]
		}
		return f.stream(ctx, cc, benchproc.ZoneName(i), token, cfg.sotw)
	}
	return f.Run(cfg.zones, cfg.streamsPerConn, dial, stream, 2*time.Second, func() string {
		if left := f.remaining.Load(); left > 0 {
			return fmt.Sprintf("progress %d %d", int64(cfg.zones)-left, f.acked.Load())
		}
		return ""
	})
}

// fleet is the zones' shared progress.
type fleet struct {
	fleetproc.Fleet
	cfg       fleetConfig
	start     time.Time
	remaining atomic.Int64   // zones not yet holding everything
	acked     atomic.Int64   // resources ACKed, over every zone
	reached   []atomic.Int64 // per update, the zones holding it
	codec     frameCodec     // reads responses as frames
}

// holding is what one zone holds: a bitset (one bit per resource, so a resource sent twice
// counts once, and nothing of what arrives is kept) and the next update it has not seen.
type holding struct {
	f     *fleet
	have  []uint64
	acked int
	next  int
}

func (f *fleet) holding() *holding {
	return &holding{f: f, have: make([]uint64, (f.cfg.resources+1+63)/64)}
}

// got counts resource i of Resources (benchproc.Index); update says which update it carries,
// asked only of the target.
func (h *holding) got(i int, update func() int) {
	f := h.f
	if i < 0 || i > f.cfg.resources {
		return
	}
	if h.have[i/64]&(1<<(i%64)) == 0 {
		h.have[i/64] |= 1 << (i % 64)
		f.acked.Add(1)
		if h.acked++; h.acked == f.cfg.resources+1 && f.remaining.Add(-1) == 0 {
			f.Print("synced %d", time.Since(f.start).Nanoseconds())
		}
	}
	if i == benchproc.Target {
		seq := update()
		for ; h.next <= seq && h.next < len(f.reached); h.next++ { // update seq, and any it folded in
			if f.reached[h.next].Add(1) == int64(f.cfg.zones) {
				f.Print("reached %d %d", h.next, time.Now().UnixNano())
			}
		}
	}
}

// stream is one zone's stream: it subscribes Mesh and MeshTimeout (wildcard: no names over
// SotW, where every response carries every resource of its type) and ACKs every response,
// read as frames.
func (f *fleet) stream(ctx context.Context, cc *grpc.ClientConn, name, token string, sotw bool) error {
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	desc, method := &discovery.AggregatedDiscoveryService_ServiceDesc.Streams[1], discovery.AggregatedDiscoveryService_DeltaAggregatedResources_FullMethodName
	if sotw {
		desc, method = &discovery.AggregatedDiscoveryService_ServiceDesc.Streams[0], discovery.AggregatedDiscoveryService_StreamAggregatedResources_FullMethodName
	}
	s, err := cc.NewStream(ctx, desc, method, grpc.ForceCodecV2(f.codec))
	if err != nil {
		return fmt.Errorf("%s: open the stream: %w", name, err)
	}
	request := func(typeURL, version, nonce string, node *core.Node) any {
		if sotw {
			return &discovery.DiscoveryRequest{Node: node, TypeUrl: typeURL, VersionInfo: version, ResponseNonce: nonce}
		}
		return &discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: typeURL, ResponseNonce: nonce}
	}
	node := &core.Node{Id: name}
	for _, k := range []string{resource.MeshKind, "MeshTimeout"} {
		if err := s.SendMsg(request(k, "", "", node)); err != nil {
			return fmt.Errorf("%s: subscribe %s: %w", name, k, err)
		}
		node = nil
	}
	h := f.holding()
	fr := &frame{sotw: sotw}
	for {
		if err := s.RecvMsg(fr); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		for _, i := range fr.indexes {
			h.got(i, func() int { return updateOf(fr.target) })
		}
		if err := s.SendMsg(request(fr.typeURL, fr.version, fr.nonce, nil)); err != nil {
			return fmt.Errorf("%s: ACK: %w", name, err)
		}
	}
}

// updateOf reads which update (benchproc.Updated) a delivery of the target MeshTimeout carries:
// its connection timeout is seq+1 seconds; the initial one (milliseconds) is -1.
func updateOf(a *anypb.Any) int {
	p, err := kds.Decode(a)
	if err != nil {
		return -1
	}
	d, err := time.ParseDuration(p.GetSpec().GetFields()["default"].GetStructValue().GetFields()["connectionTimeout"].GetStringValue())
	if err != nil || d < time.Second {
		return -1
	}
	return int(d/time.Second) - 1
}
