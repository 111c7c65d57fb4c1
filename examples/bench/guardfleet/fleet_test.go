package main

import (
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// A lean stream reads of a response what a stream that unmarshals it reads: the fields its ACK
// names, the resources counted, the latest update among them.
func TestALeanReadIsAnUnmarshalledOnes(t *testing.T) {
	resp := &discovery.DiscoveryResponse{VersionInfo: "v7", TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Nonce: "n3", Canary: true}
	for i := range 5 {
		a, err := anypb.New(clusterAt(i, 5, 12)) // cluster i holds updates i, i+5, i+10 <= 12
		if err != nil {
			t.Fatal(err)
		}
		resp.Resources = append(resp.Resources, a)
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	want := readSotw(resp)
	if want != (sotwResponse{version: "v7", typeURL: resp.TypeUrl, nonce: "n3", resources: 5, latest: 12}) {
		t.Fatalf("an unmarshalled response read as %+v", want)
	}
	var got sotwResponse
	if err := (leanCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got); err != nil || got != want {
		t.Fatalf("lean read %+v, %v; want %+v", got, err, want)
	}
	if err := (leanCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b[:len(b)-3])}, &got); err == nil {
		t.Fatal("a truncated response read without an error")
	}
}
