package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// relayNet stands in for the replicas' transport (the KDS listeners) in these tests: it finds a
// hub by its address, in this process.
type relayNet struct {
	mu   sync.Mutex
	hubs map[string]*testRelay
}

func (n *relayNet) add(id string) *testRelay {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hubs == nil {
		n.hubs = map[string]*testRelay{}
	}
	r := &testRelay{net: n, id: id, addr: "relay://" + id, subs: map[chan string]struct{}{}}
	n.hubs[r.addr] = r
	return r
}

func (n *relayNet) get(addr string) *testRelay {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.hubs[addr]
}

// testRelay is a Relay whose followers are channels. unreachable makes following it fail.
type testRelay struct {
	net         *relayNet
	id, addr    string
	unreachable atomic.Bool
	published   atomic.Int64

	mu      sync.Mutex
	leading bool
	subs    map[chan string]struct{}
}

func (r *testRelay) ID() string      { return r.id }
func (r *testRelay) Address() string { return r.addr }

func (r *testRelay) Lead() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leading = true
}

func (r *testRelay) Resign() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leading = false
	r.cutLocked()
}

// cut ends every follower's stream, as a hub that became unreachable would.
func (r *testRelay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cutLocked()
}

func (r *testRelay) cutLocked() {
	for ch := range r.subs {
		close(ch)
		delete(r.subs, ch)
	}
}

func (r *testRelay) Publish(p string) {
	r.published.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	for ch := range r.subs {
		select {
		case ch <- p:
		default:
			close(ch)
			delete(r.subs, ch)
		}
	}
}

func (r *testRelay) Follow(ctx context.Context, address string, ready func(), heard func(string)) error {
	hub := r.net.get(address)
	if hub == nil || hub.unreachable.Load() {
		return fmt.Errorf("%s is unreachable", address)
	}
	ch := make(chan string, 1024)
	hub.mu.Lock()
	if !hub.leading {
		hub.mu.Unlock()
		return fmt.Errorf("%s is not the hub", address)
	}
	hub.subs[ch] = struct{}{}
	hub.mu.Unlock()
	ready()
	for {
		select {
		case <-ctx.Done():
			hub.mu.Lock()
			delete(hub.subs, ch)
			hub.mu.Unlock()
			return ctx.Err()
		case p, ok := <-ch:
			if !ok {
				return errors.New("the hub ended the stream")
			}
			heard(p)
		}
	}
}

// TestTheRelayLetsOneStoreListenForAll: two stores of one PostgreSQL database with a relay each.
// The first takes the relay lock and listens; the second follows it and hears every write of a
// third process from it, not by a LISTEN of its own. While the hub cannot be reached the follower
// listens itself, and follows again once it can; when the hub's store closes, the follower is
// elected and listens; without a relay it listens alone. Through all of it no write goes
// unheard: the follower's revision reaches each write's.
func TestTheRelayLetsOneStoreListenForAll(t *testing.T) {
	g, ctx := NewWithT(t), context.Background()
	dsn := pg.Database(t)
	w := openStore(t, dsn) // the writer: a process without a relay
	_, _, err := w.Put(ctx, mesh("m"))
	g.Expect(err).NotTo(HaveOccurred())
	net := &relayNet{}
	a, ra := openPostgresTest(t, dsn, nil), net.add("A")
	a.SetRelay(ra)
	g.Eventually(a.ListenStatus, 10*time.Second).Should(And(HaveField("Relay", RelayHub), HaveField("Listening", true)))
	b, rb := openPostgresTest(t, dsn, nil), net.add("B")
	b.SetRelay(rb)
	g.Eventually(b.ListenStatus, 10*time.Second).Should(And(HaveField("Relay", RelayFollower), HaveField("Hub", "relay://A"), HaveField("Listening", true)))

	n := 0
	heard := func(why string) {
		t.Helper()
		n++
		_, _, err := w.Put(ctx, policy("MeshTimeout", "m", fmt.Sprintf("p-%02d", n), `{}`))
		g.Expect(err).NotTo(HaveOccurred())
		g.Eventually(b.seen.Load, 10*time.Second).Should(Equal(revision(t, w)), why)
	}

	// Heard from the hub, with what it changed: no query.
	notified, fromLog, published := b.ListenStatus().Notified, b.ListenStatus().ChangesFromLog, ra.published.Load()
	since := revision(t, b)
	heard("a write passed on by the hub")
	g.Expect(b.ListenStatus().Notified).To(Equal(notified + 1))
	g.Expect(ra.published.Load()).To(BeNumerically(">", published))
	changed, _, _ := changesSince(t, b, since)
	g.Expect(changed).To(Equal([]string{"MeshTimeout/m/p-01"}))
	g.Expect(b.ListenStatus().ChangesFromLog).To(Equal(fromLog + 1))
	g.Expect(b.ListenStatus().Relay).To(Equal(RelayFollower), "and still following: it did not listen for it")

	// The hub cannot be reached: the follower listens itself meanwhile.
	ra.unreachable.Store(true)
	ra.cut()
	g.Eventually(b.ListenStatus, 10*time.Second).Should(And(HaveField("Relay", ""), HaveField("Listening", true)))
	g.Expect(b.ListenStatus().LastError).To(ContainSubstring("relay://A"))
	for range 3 {
		heard("a write while the hub is out of reach")
	}
	ra.unreachable.Store(false)
	g.Eventually(b.ListenStatus, 10*time.Second).Should(HaveField("Relay", RelayFollower))
	heard("a write once followed again")

	// The hub's store closes: the follower is elected.
	a.Close()
	g.Eventually(b.ListenStatus, 10*time.Second).Should(And(HaveField("Relay", RelayHub), HaveField("Listening", true)))
	heard("a write heard by the new hub's own LISTEN")

	// Without a relay it listens alone, and releases the lock for any other store.
	b.SetRelay(nil)
	g.Eventually(b.ListenStatus, 10*time.Second).Should(And(HaveField("Relay", ""), HaveField("Listening", true)))
	heard("a write heard alone")
	c, rc := openPostgresTest(t, dsn, nil), net.add("C")
	c.SetRelay(rc)
	g.Eventually(c.ListenStatus, 10*time.Second).Should(HaveField("Relay", RelayHub))
}
