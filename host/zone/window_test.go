package zone

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/kds-host/kds-host/host/internal/h2test"

	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
)

// A zone's connection to its global has fixed flow-control windows (Window, the stream's and
// the connection's), as Envoy's do: no bandwidth-delay PINGs for the global to read and answer
// after each response. Its first SETTINGS and WINDOW_UPDATE say so.
func TestTheZonesWindowIsFixed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	st, err := store.Open(context.Background(), "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c, err := New(Config{Zone: "zone-1", GlobalAddress: "grpc://" + ln.Addr().String(), Store: st, Registry: resource.Default()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); c.Run(ctx) }()
	defer func() { cancel(); <-ran }()

	ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(conn, preface); err != nil || string(preface) != http2.ClientPreface {
		t.Fatalf("the zone's preface: %q, %v", preface, err)
	}
	fr := http2.NewFramer(conn, conn)
	window, connWindow, err := h2test.Windows(fr)
	if err != nil {
		t.Fatal(err)
	}
	if window != Window || connWindow != Window {
		t.Fatalf("stream window %d, connection window %d; want %d each", window, connWindow, Window)
	}
}
