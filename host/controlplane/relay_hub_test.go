package controlplane

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/host/auth"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// followerStream is the hub's end of a follower's stream: each Send waits until the test lets
// it through on next.
type followerStream struct {
	grpc.ServerStream
	ctx  context.Context
	next chan struct{}
	sent []*kdsv1.Notification
}

func (s *followerStream) Context() context.Context { return s.ctx }

func (s *followerStream) Send(n *kdsv1.Notification) error {
	select {
	case <-s.next:
		s.sent = append(s.sent, n)
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

// TestTheHubDropsAFollowerThatFallsBehind: the hub never waits for a follower. One that takes
// nothing while more than its backlog is published is dropped with RESOURCE_EXHAUSTED, and its
// stream ends before anything more is sent; the others keep everything. The hub's resignation
// ends every stream with UNAVAILABLE, and a replica that is not the hub takes no follower.
func TestTheHubDropsAFollowerThatFallsBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		keys, err := auth.NewKeys()
		g.Expect(err).NotTo(HaveOccurred())
		r := newChangesRelay("A", "grpc://a:5685", keys, nil, hclog.NewNullLogger())
		tok, err := keys.Issue(auth.Claims{Kind: auth.KindReplica, Name: "b"}, time.Minute, time.Now())
		g.Expect(err).NotTo(HaveOccurred())
		ctx, cancel := context.WithCancel(metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok)))
		defer cancel()
		follow := func(s *followerStream) chan error {
			done := make(chan error, 1)
			go func() { done <- relayServer{r: r}.Follow(&kdsv1.FollowRequest{Replica: "b"}, s) }()
			return done
		}

		err = <-follow(&followerStream{ctx: ctx, next: make(chan struct{})})
		g.Expect(status.Code(err)).To(Equal(codes.Unavailable), "not the hub yet")

		r.Lead()
		slow, quick := &followerStream{ctx: ctx, next: make(chan struct{})}, &followerStream{ctx: ctx, next: make(chan struct{}, 2*relayBacklog)}
		for range 2 * relayBacklog {
			quick.next <- struct{}{}
		}
		slowDone, quickDone := follow(slow), follow(quick)
		slow.next <- struct{}{} // ready
		synctest.Wait()
		for i := range relayBacklog + 2 {
			r.Publish(string(rune('a' + i%26)))
			synctest.Wait()
		}
		// slow took "a" from its backlog and waits in Send: relayBacklog more fill the backlog,
		// and the one after drops it.
		close(slow.next)
		err = <-slowDone
		g.Expect(status.Code(err)).To(Equal(codes.ResourceExhausted))
		g.Expect(slow.sent).To(HaveLen(2), "ready and the payload it was sending, nothing after the drop")
		g.Expect(quick.sent).To(HaveLen(relayBacklog+3), "ready and every payload")

		r.Resign()
		err = <-quickDone
		g.Expect(status.Code(err)).To(Equal(codes.Unavailable))
		g.Expect(err.Error()).To(ContainSubstring("no longer the changes relay's hub"))
	})
}
