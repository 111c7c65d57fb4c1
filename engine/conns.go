package engine

import (
	"net"
	"sync"
	"syscall"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Conns is the registry of the xDS server's connections, by peer address, so that the server can
// drop the connection of a stream that does not read (gRPC cannot end such a stream). The
// credentials of Creds register each connection and hand gRPC the raw connection, unwrapped.
type Conns struct {
	mu    sync.Mutex // guards open and swept
	open  map[string]net.Conn
	swept int // len(open) after the last sweep of closed connections
}

// NewConns returns an empty registry.
func NewConns() *Conns { return &Conns{open: map[string]net.Conn{}} }

// Creds returns inner (nil: plaintext) with every connection it takes registered in c.
func (c *Conns) Creds(inner credentials.TransportCredentials) credentials.TransportCredentials {
	if inner == nil {
		inner = insecure.NewCredentials()
	}
	return trackingCreds{TransportCredentials: inner, conns: c}
}

// Drop closes the connection from peer (its remote address), and reports whether there was one.
func (c *Conns) Drop(peer string) bool {
	c.mu.Lock()
	conn := c.open[peer]
	delete(c.open, peer)
	c.mu.Unlock()
	if conn == nil {
		return false
	}
	conn.Close()
	return true
}

// add registers conn, and forgets the connections that closed since the registry last doubled.
func (c *Conns) add(conn net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.open[conn.RemoteAddr().String()] = conn
	if len(c.open) > 2*c.swept+64 {
		for peer, o := range c.open {
			if closed(o) {
				delete(c.open, peer)
			}
		}
		c.swept = len(c.open)
	}
}

// closed reports whether conn's file descriptor is closed.
func closed(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	return rc.Control(func(uintptr) {}) != nil
}

// trackingCreds registers each connection it takes in conns.
type trackingCreds struct {
	credentials.TransportCredentials
	conns *Conns
}

func (t trackingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	t.conns.add(raw)
	return t.TransportCredentials.ServerHandshake(raw)
}

func (t trackingCreds) Clone() credentials.TransportCredentials {
	return trackingCreds{TransportCredentials: t.TransportCredentials.Clone(), conns: t.conns}
}
