package kds

import (
	"net"
	"sync"
)

// Conns is the registry of the KDS server's connections, by peer address, so that the server can
// drop the connection of a stream that does not read: gRPC cannot end such a stream, because the
// status that would end it waits behind the data the peer does not read, and so do the bytes
// gRPC holds for it, until the connection closes. Serve the server on Wrap(ln).
type Conns struct {
	mu   sync.Mutex // guards open
	open map[string]*trackedConn
}

// NewConns returns an empty registry.
func NewConns() *Conns { return &Conns{open: map[string]*trackedConn{}} }

// Wrap returns ln, its connections registered in c while open.
func (c *Conns) Wrap(ln net.Listener) net.Listener { return &trackedListener{Listener: ln, conns: c} }

// Drop closes the connection from peer (its remote address), and reports whether there was one.
func (c *Conns) Drop(peer string) bool {
	c.mu.Lock()
	tc := c.open[peer]
	c.mu.Unlock()
	if tc == nil {
		return false
	}
	tc.Close()
	return true
}

type trackedListener struct {
	net.Listener
	conns *Conns
}

func (l *trackedListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: conn, conns: l.conns, peer: conn.RemoteAddr().String()}
	l.conns.mu.Lock()
	l.conns.open[tc.peer] = tc
	l.conns.mu.Unlock()
	return tc, nil
}

// trackedConn is a connection of Conns, which it leaves when it closes.
type trackedConn struct {
	net.Conn
	conns *Conns
	peer  string
	once  sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.conns.mu.Lock()
		if c.conns.open[c.peer] == c {
			delete(c.conns.open, c.peer)
		}
		c.conns.mu.Unlock()
	})
	return c.Conn.Close()
}
