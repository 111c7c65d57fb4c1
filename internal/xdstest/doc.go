// Package xdstest is a harness that drives grpc-go's own xDS client (google.golang.org/grpc/xds,
// state-of-the-world ADS) against an xDS management server on loopback, with real gRPC backends
// and no mocks, and four scenarios (Scenario1RefusedCluster ... Scenario4UnrequestedCluster) that
// run against any Server: the stock go-control-plane SotW ADS server (NewStock) now, a guarded
// cache later.
//
// # Bootstrap: one client process per Client
//
// grpc-go v1.85 reads GRPC_XDS_BOOTSTRAP_CONFIG once per process: internal/envconfig copies the
// variable into a package variable at init, and xdsclient.DefaultPool reads it through a
// sync.OnceValues. Every "xds:///" channel of a process built with the default resolver therefore
// shares one bootstrap, and so one management server. The exported escape hatch,
// xds.NewXDSResolverWithConfigForTesting, builds a private xdsclient.Pool per resolver, but the CSDS
// service (xds/csds) dumps only xdsclient.DefaultPool, so a client made that way is invisible to
// CSDS (the hatch's doc says so); the per-pool hook (NewXDSResolverWithPoolForTesting) is in
// google.golang.org/grpc/internal, which this module cannot import.
//
// So each Client is a child process (the program in ./cmd/xdsclient, built once per process with
// `go build` into a temporary directory, or taken from $XDSTEST_CLIENT_BIN), started with
// GRPC_XDS_BOOTSTRAP_CONFIG set to a bootstrap that names the server under test. The child dials
// "xds:///svc" with the default xds resolver, serves the CSDS service (registered on a gRPC server
// on 127.0.0.1:0) and runs the RPC loop when told to; the parent talks to it with one JSON line per
// command on its stdin/stdout. Any number of Clients against any number of servers can run in one
// `go test` process, and each is exactly what production does: bootstrap from the environment.
package xdstest
