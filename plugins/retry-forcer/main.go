// Command retry-forcer is kds-host's reference RetryForcer plugin: exponential backoff with full
// jitter by default, fixed or decorrelated jitter by its policy document. The host starts it and
// configures it; KDS_RETRY_FORCER_CONFIG may name a policy document to start with.
package main

import (
	crand "crypto/rand"
	"fmt"
	"math/rand/v2"
	"os"

	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
	"github.com/kds-host/kds-host/shared"
)

// configEnv names a policy document to put in force at start.
const configEnv = "KDS_RETRY_FORCER_CONFIG"

func main() {
	f, err := newForcer(os.Getenv(configEnv))
	if err != nil {
		fmt.Fprintf(os.Stderr, "retry-forcer: %v\n", err)
		os.Exit(1)
	}
	shared.ServeRetryForcer(f)
}

// newForcer returns a Forcer with jitter seeded from crypto/rand, configured from the policy
// document at path when path is not empty.
func newForcer(path string) (*retrypolicy.Forcer, error) {
	var seed [32]byte
	_, _ = crand.Read(seed[:]) // never fails on supported platforms
	f := retrypolicy.New(retrypolicy.WithRand(rand.New(rand.NewChaCha8(seed))))
	if path == "" {
		return f, nil
	}
	doc, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", configEnv, err)
	}
	cfg, err := retrypolicy.Parse(doc)
	if err != nil {
		return nil, fmt.Errorf("%s=%s: %w", configEnv, path, err)
	}
	if err := f.Apply(cfg); err != nil {
		return nil, fmt.Errorf("%s=%s: %w", configEnv, path, err)
	}
	return f, nil
}
