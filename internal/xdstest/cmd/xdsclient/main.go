// Command xdsclient is the child process of an xdstest.Client (see the package doc of xdstest): a
// grpc-go xDS client bootstrapped from GRPC_XDS_BOOTSTRAP_CONFIG that dials xdstest.Target, serves
// CSDS on 127.0.0.1:0, and runs the RPC loop on command. It writes one JSON line
// {"csds":"127.0.0.1:port"} when up, then answers each JSON command line of stdin ({"op":"start"},
// {"op":"take"}, {"op":"stop"}) with one JSON line; it exits when stdin closes.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"

	v3statusgrpc "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/xds" // the xds resolver and balancers
	"google.golang.org/grpc/xds/csds"

	"github.com/kds-host/kds-host/internal/xdstest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "xdsclient:", err)
		os.Exit(1)
	}
}

func run() error {
	if os.Getenv("GRPC_XDS_BOOTSTRAP_CONFIG") == "" {
		return fmt.Errorf("GRPC_XDS_BOOTSTRAP_CONFIG is not set")
	}
	target := xdstest.Target
	if t := os.Getenv("XDSTEST_TARGET"); t != "" {
		target = t
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	admin := grpc.NewServer()
	cs, err := csds.NewClientStatusDiscoveryServer()
	if err != nil {
		return err
	}
	defer cs.Close()
	v3statusgrpc.RegisterClientStatusDiscoveryServiceServer(admin, cs)
	go admin.Serve(lis)
	defer admin.Stop()

	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	cc.Connect()

	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(map[string]string{"csds": lis.Addr().String()}); err != nil {
		return err
	}
	var loop *xdstest.Loop
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var cmd xdstest.ChildCommand
		var reply xdstest.ChildReply
		if err := json.Unmarshal(in.Bytes(), &cmd); err != nil {
			reply.Error = err.Error()
		} else {
			switch cmd.Op {
			case "start":
				if loop == nil {
					loop = xdstest.StartLoop(cc, cmd.Interval, cmd.Deadline)
				}
			case "take":
				if loop != nil {
					reply.Counts = loop.Take()
				}
			case "stop":
				if loop != nil {
					reply.Counts = loop.Stop()
					loop = nil
				}
			default:
				reply.Error = fmt.Sprintf("unknown op %q", cmd.Op)
			}
		}
		if err := out.Encode(reply); err != nil {
			return err
		}
	}
	if loop != nil {
		loop.Stop()
	}
	return in.Err()
}
