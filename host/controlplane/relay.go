package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/store"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// relayBacklog is how many notifications the hub keeps for a follower that has not taken them
// yet: one that falls further behind is dropped, and catches up by reading the revision when it
// follows again (or listens itself).
const relayBacklog = 4096

// relayTimeout bounds a follower's wait for the hub to take it on, and the token it presents.
const relayTimeout = 5 * time.Second

// changesRelay is the store's changes relay (store.Relay) over the replicas' KDS listeners: the
// hub serves kds.v1.ChangesRelay, and a follower calls it. Both ends prove they are replicas of
// one fleet by a replica token signed with the fleet's shared key: a follower presents one, minted
// for the call and valid for a minute, and the hub refuses any other token.
type changesRelay struct {
	id, address string
	keys        *auth.Keys
	tls         *tls.Config // what a follower dials the hub with; nil: plaintext
	log         hclog.Logger
	now         func() time.Time

	// lastFollowErr is why the last Follow failed, logged once; Follow's caller is one goroutine.
	lastFollowErr string

	mu        sync.Mutex // guards leading and followers
	leading   bool
	followers map[*relayFollower]struct{}
}

// relayFollower is a follower the hub took on: its backlog, and why it was dropped.
type relayFollower struct {
	replica string
	backlog chan string
	dropped chan struct{} // closed when the hub resigns or the follower fell behind
	why     error
}

// storeRelay returns the changes relay of a global whose store shares its LISTEN
// (GlobalConfig.StoreRelay), and the store; nil when there is none.
func (g *Global) storeRelay() (store.Relayer, *changesRelay) {
	rs, ok := g.cfg.Store.(store.Relayer)
	l, listens := g.cfg.Store.(store.Listener)
	if !g.cfg.StoreRelay || g.cfg.Keys == nil || !ok || !listens || !l.ListenStatus().Enabled {
		return nil, nil
	}
	return rs, newChangesRelay(g.replicas.id, g.replicas.address, g.cfg.Keys, g.cfg.TLS, g.log.Named("relay"))
}

func newChangesRelay(id, address string, keys *auth.Keys, serverTLS *tls.Config, log hclog.Logger) *changesRelay {
	return &changesRelay{id: id, address: address, keys: keys, tls: relayClientTLS(serverTLS), log: log, now: time.Now, followers: map[*relayFollower]struct{}{}}
}

// relayClientTLS is how a follower dials a hub served with serverTLS: it trusts the system's
// roots and every certificate of its own serving chain, so replicas that share a certificate, or
// its issuer, verify each other. It presents no certificate: the replica token says who it is.
// Replicas with certificates of their own that nothing here signed (each one's self-signed
// default) do not verify each other: each then listens itself.
func relayClientTLS(serverTLS *tls.Config) *tls.Config {
	if serverTLS == nil {
		return nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	for _, c := range serverTLS.Certificates {
		for _, der := range c.Certificate {
			if cert, err := x509.ParseCertificate(der); err == nil {
				pool.AddCert(cert)
			}
		}
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

func (r *changesRelay) ID() string      { return r.id }
func (r *changesRelay) Address() string { return r.address }

func (r *changesRelay) Lead() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leading = true
	r.log.Info("this replica is the changes relay's hub", "address", r.address)
}

func (r *changesRelay) Resign() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.leading {
		return
	}
	r.leading = false
	for f := range r.followers {
		r.dropLocked(f, status.Error(codes.Unavailable, "this replica is no longer the changes relay's hub"))
	}
	r.log.Info("this replica is no longer the changes relay's hub")
}

// Publish queues payload for every follower; a follower whose backlog is full is dropped.
func (r *changesRelay) Publish(payload string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for f := range r.followers {
		select {
		case f.backlog <- payload:
		default:
			r.dropLocked(f, status.Errorf(codes.ResourceExhausted, "the follower fell %d notifications behind", relayBacklog))
			r.log.Warn("changes relay: a follower fell behind, dropped", "replica", f.replica, "backlog", relayBacklog)
		}
	}
}

func (r *changesRelay) dropLocked(f *relayFollower, why error) {
	if _, ok := r.followers[f]; !ok {
		return
	}
	delete(r.followers, f)
	f.why = why
	close(f.dropped)
}

// relayServer serves kds.v1.ChangesRelay for r: a type of its own, as r's Follow is the
// follower's end.
type relayServer struct {
	kdsv1.UnimplementedChangesRelayServer
	r *changesRelay
}

// Follow takes a follower on while this replica is the hub, and sends it every notification
// published until the hub resigns, the follower falls behind, or it goes.
func (s relayServer) Follow(req *kdsv1.FollowRequest, stream grpc.ServerStreamingServer[kdsv1.Notification]) error {
	r := s.r
	if err := r.authenticate(stream.Context()); err != nil {
		r.log.Warn("changes relay: refused a follower", "replica", req.GetReplica(), "error", err)
		return err
	}
	f := &relayFollower{replica: req.GetReplica(), backlog: make(chan string, relayBacklog), dropped: make(chan struct{})}
	r.mu.Lock()
	if !r.leading {
		r.mu.Unlock()
		return status.Error(codes.Unavailable, "this replica is not the changes relay's hub")
	}
	r.followers[f] = struct{}{}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.dropLocked(f, nil)
		r.mu.Unlock()
	}()
	r.log.Debug("changes relay: follower taken on", "replica", f.replica)
	if err := stream.Send(&kdsv1.Notification{Ready: true}); err != nil {
		return err
	}
	for {
		select {
		case <-f.dropped: // before whatever is left of the backlog
			return f.why
		default:
		}
		select {
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-f.dropped:
			return f.why
		case p := <-f.backlog:
			// A Send waits only for the follower's flow-control window: a follower takes each
			// notification as it comes (store.Relay.Follow), and its keepalive ends the stream
			// if it is gone.
			if err := stream.Send(&kdsv1.Notification{Payload: p}); err != nil {
				return err
			}
		}
	}
}

// authenticate accepts a call that carries a replica token signed by a key of the fleet's.
func (r *changesRelay) authenticate(ctx context.Context) error {
	tok, err := auth.BearerToken(ctx)
	if err != nil {
		return err
	}
	if tok == "" {
		return status.Error(codes.Unauthenticated, "the changes relay needs a replica token in the authorization metadata")
	}
	c, err := r.keys.Verify(tok, r.now())
	if err != nil {
		return status.Errorf(codes.Unauthenticated, "replica token: %v", err)
	}
	if c.Kind != auth.KindReplica {
		return status.Errorf(codes.PermissionDenied, "a %s token may not follow the changes relay: it takes a replica token", c.Kind)
	}
	return nil
}

// Follow is the follower's end: it follows the hub at address (grpc:// or grpcs://, as
// ReplicaAddress) until ctx ends or the stream fails. It logs when it is taken on, and why it
// could not be or the stream ended, once for as long as the reason stays the same: a replica
// that cannot follow tries again every few seconds.
func (r *changesRelay) Follow(ctx context.Context, address string, ready func(), heard func(payload string)) error {
	followed := false
	err := r.follow(ctx, address, func() {
		followed = true
		r.lastFollowErr = ""
		r.log.Info("following the changes relay's hub", "hub", address)
		ready()
	}, heard)
	if ctx.Err() == nil {
		if why := err.Error(); followed || why != r.lastFollowErr {
			r.lastFollowErr = why
			msg := "could not follow the changes relay's hub: listening alone until it can"
			if followed {
				msg = "the changes relay's hub ended the stream"
			}
			r.log.Warn(msg, "hub", address, "error", err)
		}
	}
	return err
}

func (r *changesRelay) follow(ctx context.Context, address string, ready func(), heard func(payload string)) error {
	target, creds, err := r.dialOptions(address)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds),
		// A hub that is gone without a word (a partition) is noticed within 15 s; the hub's
		// KDS listener allows a ping every 5 s.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}))
	if err != nil {
		return fmt.Errorf("dial %s: %w", address, err)
	}
	defer conn.Close()
	tok, err := r.keys.Issue(auth.Claims{Kind: auth.KindReplica, Name: tokenName(r.id)}, time.Minute, r.now())
	if err != nil {
		return fmt.Errorf("mint a replica token: %w", err)
	}
	sctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok))
	defer cancel()
	// Until the hub takes this follower on, the call has relayTimeout.
	late := time.AfterFunc(relayTimeout, cancel)
	stream, err := kdsv1.NewChangesRelayClient(conn).Follow(sctx, &kdsv1.FollowRequest{Replica: r.id})
	var first *kdsv1.Notification
	if err == nil {
		first, err = stream.Recv()
	}
	if !late.Stop() && ctx.Err() == nil {
		return fmt.Errorf("the hub at %s did not take this follower on within %s", address, relayTimeout)
	}
	if err != nil {
		return err
	}
	if !first.GetReady() {
		return errors.New("the hub sent a notification before taking this follower on")
	}
	ready()
	for {
		n, err := stream.Recv()
		if err != nil {
			return err
		}
		heard(n.GetPayload())
	}
}

// dialOptions turns a replica address into a gRPC target and the credentials to reach it with.
func (r *changesRelay) dialOptions(address string) (string, credentials.TransportCredentials, error) {
	u, err := url.Parse(address)
	if err != nil || u.Host == "" {
		return "", nil, fmt.Errorf("hub address %q: want grpc://HOST:PORT or grpcs://HOST:PORT", address)
	}
	switch {
	case u.Scheme == "grpcs" && r.tls != nil:
		return "passthrough:///" + u.Host, credentials.NewTLS(r.tls), nil
	case u.Scheme == "grpc" && r.tls == nil:
		return "passthrough:///" + u.Host, insecure.NewCredentials(), nil
	}
	return "", nil, fmt.Errorf("hub address %q: this replica serves KDS with TLS %v, and follows only a hub that does too", address, r.tls != nil)
}

// tokenName is a replica id as a token's name: lower case, with anything a name may not hold
// (the port's colon) as a dash.
func tokenName(id string) string {
	b := []byte(strings.ToLower(id))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			b[i] = '-'
		}
	}
	name := strings.Trim(string(b), "-.")
	if auth.ValidName(name) != nil {
		return "replica"
	}
	return name
}
