package policy_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/kds-host/kds-host/policy"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// A server's retry policy: here the built-in one, configured; a plugin binary is a Plugin with
// its Path (and SHA256), as ParsePlugin reads "PATH@sha256:HEX".
func ExampleOpen() {
	rt, err := policy.Open(context.Background(), []policy.Plugin{
		{Path: policy.Builtin, Config: []byte("policy: fixed\ndelay: 2s\n")},
	}, policy.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close()
	resp, err := rt.RetryForcer().Schedule(context.Background(), &pluginv1.ScheduleRequest{Zone: "node-1", Round: 1,
		Failing: []*pluginv1.FailingKind{{Kind: "type.googleapis.com/envoy.config.cluster.v3.Cluster", RejectedNames: []string{"backend"}}}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.GetDelay().AsDuration())
	// Output: 2s
}

// An in-process policy that ignores its context is given up on at its deadline.
func ExampleWithin() {
	var abandoned policy.Abandoned // one per policy
	release := make(chan struct{})
	defer close(release)
	_, err := policy.Within(context.Background(), &abandoned, 10*time.Millisecond, func(context.Context) (time.Duration, error) {
		<-release // ignores its context
		return time.Second, nil
	})
	fmt.Println(err)
	// Output: policy call abandoned at its 10ms deadline: context deadline exceeded
}
