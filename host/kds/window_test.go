package kds_test

import (
	"context"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/kds-host/kds-host/host/kds"
)

// The KDS server's flow-control windows are fixed (kds.ServerWindow, a stream's and the
// connection's), which is what turns off grpc-go's bandwidth-delay PINGs: its first SETTINGS
// say so to a client, and its first WINDOW_UPDATE opens the connection's window to the same.
func TestTheServerWindowIsFixed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := kds.NewCache([]string{"a"})
	defer c.Close()
	srv, _ := kds.NewGRPCServer(ctx, c, kds.NewTracker(c), kds.ServerConfig{})
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
	var window, connWindow uint32
	for window == 0 || connWindow == 0 {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the server's first frames: %v (stream window %d, connection window %d so far)", err, window, connWindow)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			v, ok := f.Value(http2.SettingInitialWindowSize)
			if !ok {
				t.Fatalf("the server's SETTINGS name no initial window: a dynamic window (BDP pings)")
			}
			window = v
			if err := fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				connWindow = 65535 + f.Increment
			}
		}
	}
	if window != kds.ServerWindow || connWindow != kds.ServerWindow {
		t.Fatalf("stream window %d, connection window %d; want %d each", window, connWindow, kds.ServerWindow)
	}
}
