package xdstest

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// Backend is a real gRPC server on 127.0.0.1:0 serving grpc.testing.TestService; UnaryCall answers
// with ServerId = Name, which is how the RPC loop tells which backend served.
type Backend struct {
	Name string
	Addr string // 127.0.0.1:port
	srv  *grpc.Server
}

type testService struct {
	testgrpc.UnimplementedTestServiceServer
	name string
}

func (s *testService) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

func (s *testService) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{ServerId: s.name}, nil
}

// StartBackend starts a backend named name.
func StartBackend(name string) (*Backend, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("xdstest: backend %s: %w", name, err)
	}
	s := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(s, &testService{name: name})
	go s.Serve(lis)
	return &Backend{Name: name, Addr: lis.Addr().String(), srv: s}, nil
}

// StartBackends starts n backends named prefix0 ... prefix(n-1).
func StartBackends(prefix string, n int) ([]*Backend, error) {
	var bs []*Backend
	for i := range n {
		b, err := StartBackend(fmt.Sprintf("%s%d", prefix, i))
		if err != nil {
			StopBackends(bs)
			return nil, err
		}
		bs = append(bs, b)
	}
	return bs, nil
}

// Stop stops the backend at once.
func (b *Backend) Stop() { b.srv.Stop() }

// StopBackends stops every backend of bs.
func StopBackends(bs []*Backend) {
	for _, b := range bs {
		b.Stop()
	}
}
