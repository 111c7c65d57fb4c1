package kds_test

import (
	"context"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/host/internal/h2test"

	"github.com/kds-host/kds-host/host/kds"
)

// The KDS server's flow-control windows are fixed (kds.ServerWindow, a stream's and the
// connection's), which is what turns off grpc-go's bandwidth-delay PINGs: its first SETTINGS
// say so to a client, and its first WINDOW_UPDATE opens the connection's window to the same.
func TestTheServerWindowIsFixed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := engine.NewCache([]string{"a"})
	defer c.Close()
	srv, _ := kds.NewGRPCServer(ctx, c, engine.NewTracker(c), kds.ServerConfig{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()

	conn, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	window, connWindow, err := h2test.Windows(fr)
	if err != nil {
		t.Fatal(err)
	}
	if window != kds.ServerWindow || connWindow != kds.ServerWindow {
		t.Fatalf("stream window %d, connection window %d; want %d each", window, connWindow, kds.ServerWindow)
	}
}
