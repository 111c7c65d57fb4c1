package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kds-host/kds-host/examples/bench/internal/fleetproc"
	"github.com/kds-host/kds-host/host/zone"
)

// fleetConfig is what the fleet process is told on its command line.
type fleetConfig struct {
	addr           string
	streams        int
	streamsPerConn int
	clusters       int  // what a stream holds once it has the full state
	updates        int  // updates the driver will make (warm-up included)
	delta          bool // delta (wildcard) streams instead of SotW
	fixedWindows   bool // fixed HTTP/2 flow-control windows instead of grpc-go's defaults
	lean           bool // SotW responses read with leanCodec
}

// The fleet prints, on its standard output:
//
//	progress STREAMS             every 2 s until synced: streams holding every cluster
//	synced NANOSECONDS           every stream holds every cluster, NANOSECONDS after the first dial
//	got SEQ FIRST LAST           every stream holds update SEQ; the first and the last got it at
//	                             FIRST and LAST (Unix nanoseconds, the machine's wall clock)
//
// and closes every stream and exits once its standard input closes. A stream that fails ends
// the process with an error.
func runFleet(cfg fleetConfig) error {
	f := &fleet{cfg: cfg, reached: make([]atomic.Int64, cfg.updates), first: make([]atomic.Int64, cfg.updates)}
	f.remaining.Store(int64(cfg.streams))
	f.start = time.Now()
	dial := func() (*grpc.ClientConn, error) {
		// grpc-go's defaults, as a proxyless client dials; or windows fixed as Envoy's and a
		// kds-host zone's are (no bandwidth-delay PINGs).
		opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if cfg.fixedWindows {
			opts = append(opts, grpc.WithStaticStreamWindowSize(zone.Window),
				grpc.WithStaticConnWindowSize(int32(min(int64(cfg.streamsPerConn)*zone.Window, math.MaxInt32))))
		}
		return grpc.NewClient(cfg.addr, opts...)
	}
	stream := func(ctx context.Context, cc *grpc.ClientConn, i int) error {
		node := fmt.Sprintf("node-%05d", i)
		var err error
		if cfg.delta {
			err = f.deltaStream(ctx, cc, node)
		} else {
			err = f.sotwStream(ctx, cc, node)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", node, err)
		}
		return nil
	}
	return f.Run(cfg.streams, cfg.streamsPerConn, dial, stream, 2*time.Second, func() string {
		if left := f.remaining.Load(); left > 0 {
			return fmt.Sprintf("progress %d", int64(cfg.streams)-left)
		}
		return ""
	})
}

// fleet is the streams' shared progress.
type fleet struct {
	fleetproc.Fleet
	cfg       fleetConfig
	start     time.Time
	remaining atomic.Int64   // streams not yet holding every cluster
	reached   []atomic.Int64 // per update, the streams holding it
	first     []atomic.Int64 // per update, when the first stream got it (Unix ns)
}

// stream is one stream's progress: whether it holds every cluster, and the next update it has
// not seen.
type stream struct {
	f      *fleet
	synced bool
	next   int
}

// holdsAll notes that the stream holds every cluster.
func (s *stream) holdsAll() {
	if !s.synced {
		s.synced = true
		if s.f.remaining.Add(-1) == 0 {
			s.f.Print("synced %d", time.Since(s.f.start).Nanoseconds())
		}
	}
}

// holds notes that the stream holds update latest (and every update before it: the file
// carries them all).
func (s *stream) holds(latest int) {
	f := s.f
	if latest < s.next {
		return
	}
	now := time.Now().UnixNano()
	for ; s.next <= latest && s.next < len(f.reached); s.next++ {
		f.first[s.next].CompareAndSwap(0, now)
		if f.reached[s.next].Add(1) == int64(f.cfg.streams) {
			f.Print("got %d %d %d", s.next, f.first[s.next].Load(), now)
		}
	}
}

// sotwStream is one SotW stream: CDS, wildcard (no names), every response ACKed. Each response
// carries every cluster.
func (f *fleet) sotwStream(ctx context.Context, cc *grpc.ClientConn, node string) error {
	var opts []grpc.CallOption
	if f.cfg.lean {
		opts = append(opts, grpc.ForceCodecV2(leanCodec{encoding.GetCodecV2("proto")}))
	}
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{StreamName: "StreamAggregatedResources", ServerStreams: true, ClientStreams: true},
		discovery.AggregatedDiscoveryService_StreamAggregatedResources_FullMethodName, opts...)
	if err != nil {
		return err
	}
	if err := st.SendMsg(&discovery.DiscoveryRequest{Node: &core.Node{Id: node}, TypeUrl: resource.ClusterType}); err != nil {
		return err
	}
	s := &stream{f: f}
	for {
		r, err := f.recvSotw(st)
		if err != nil {
			return err
		}
		if r.resources >= f.cfg.clusters {
			s.holdsAll()
		}
		if s.synced {
			s.holds(r.latest)
		}
		if err := st.SendMsg(&discovery.DiscoveryRequest{TypeUrl: r.typeURL, VersionInfo: r.version, ResponseNonce: r.nonce}); err != nil {
			return err
		}
	}
}

// sotwResponse is what a SotW stream reads of a response: the fields its ACK names, how many
// resources it carries and the latest update in them (-1: none).
type sotwResponse struct {
	version, typeURL, nonce string
	resources, latest       int
}

// recvSotw reads the next response: unmarshalled into a DiscoveryResponse, as a client does,
// or with -lean by leanCodec.
func (f *fleet) recvSotw(st grpc.ClientStream) (sotwResponse, error) {
	if f.cfg.lean {
		var r sotwResponse
		return r, st.RecvMsg(&r)
	}
	var m discovery.DiscoveryResponse
	err := st.RecvMsg(&m)
	return readSotw(&m), err
}

// readSotw is what a SotW stream reads of an unmarshalled response.
func readSotw(m *discovery.DiscoveryResponse) sotwResponse {
	r := sotwResponse{version: m.GetVersionInfo(), typeURL: m.GetTypeUrl(), nonce: m.GetNonce(), resources: len(m.GetResources()), latest: -1}
	for _, a := range m.GetResources() {
		r.latest = max(r.latest, latestUpdate(a.GetValue()))
	}
	return r
}

// leanCodec is gRPC's proto codec (its Name and Marshal, for what the fleet sends), except that
// it reads a DiscoveryResponse into a sotwResponse straight from the wire, its resources counted
// and their bytes scanned, none unmarshalled: the fleet's decoding then takes less of the machine
// the server shares.
type leanCodec struct{ encoding.CodecV2 }

func (leanCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*sotwResponse)
	if !ok {
		return fmt.Errorf("lean codec: cannot read into %T", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	*r = sotwResponse{latest: -1}
	return fleetproc.EachField(buf.ReadOnlyData(), func(num protowire.Number, v []byte) error {
		switch num { // DiscoveryResponse's fields
		case 1:
			r.version = string(v)
		case 2:
			r.resources++
			r.latest = max(r.latest, latestUpdate(v))
		case 4:
			r.typeURL = string(v)
		case 5:
			r.nonce = string(v)
		}
		return nil
	})
}

// deltaStream is one delta stream: CDS, wildcard, every response ACKed. A response carries what
// changed.
func (f *fleet) deltaStream(ctx context.Context, cc *grpc.ClientConn, node string) error {
	st, err := discovery.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: node}, TypeUrl: resource.ClusterType}); err != nil {
		return err
	}
	s := &stream{f: f}
	have := make([]bool, f.cfg.clusters)
	held := 0
	for {
		r, err := st.Recv()
		if err != nil {
			return err
		}
		latest := -1
		for _, res := range r.GetResources() {
			latest = max(latest, latestUpdate(res.GetResource().GetValue()))
			i, err := strconv.Atoi(strings.TrimPrefix(res.GetName(), "cluster-"))
			if err == nil && i >= 0 && i < len(have) && !have[i] {
				have[i] = true
				held++
			}
		}
		if held == f.cfg.clusters {
			s.holdsAll()
		}
		if s.synced {
			s.holds(latest)
		}
		if err := st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce()}); err != nil {
			return err
		}
	}
}
