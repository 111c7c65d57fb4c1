package engine

import (
	"net"
	"testing"

	. "github.com/onsi/gomega"
)

// The registry hands gRPC the connection itself, unwrapped (grpc-go pools the read buffers of raw
// TCP connections only: a wrapper cost 32 KiB a connection), drops it by its peer's address, and
// forgets the connections that closed as it grows.
func TestConnsRegisterTheRawConnectionAndForgetClosedOnes(t *testing.T) {
	g := NewWithT(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	defer ln.Close()
	c := NewConns()
	creds := c.Creds(nil)
	var clients []net.Conn
	defer func() {
		for _, cl := range clients {
			cl.Close()
		}
	}()
	accept := func() net.Conn {
		cl, err := net.Dial("tcp", ln.Addr().String())
		g.Expect(err).NotTo(HaveOccurred())
		clients = append(clients, cl)
		raw, err := ln.Accept()
		g.Expect(err).NotTo(HaveOccurred())
		conn, _, err := creds.ServerHandshake(raw)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(conn).To(BeIdenticalTo(raw), "unwrapped")
		return raw
	}
	first := accept()
	g.Expect(c.Drop(first.RemoteAddr().String())).To(BeTrue())
	g.Expect(c.Drop(first.RemoteAddr().String())).To(BeFalse(), "dropped once")

	for range 300 {
		accept().Close()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	g.Expect(len(c.open)).To(BeNumerically("<=", 65), "the closed ones swept as the registry grows")
}
