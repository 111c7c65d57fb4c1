// Package fleetproc is the frame of a bench's fleet process (examples/bench/scale's zones,
// examples/bench/guardfleet's clients): many streams over a few connections, their first
// failure, lines printed one at a time on standard output for the driver, and an end when the
// driver closes the process's standard input; and EachField, for a fleet that reads responses
// from the wire.
package fleetproc

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/kds-host/kds-host/examples/bench/internal/benchproc"
)

// Fleet runs a fleet's streams. Its zero value is ready.
type Fleet struct {
	out    sync.Mutex // one line at a time on stdout
	once   sync.Once
	failed chan error
	wg     sync.WaitGroup
	conns  []*grpc.ClientConn
}

// Print prints one line on standard output.
func (f *Fleet) Print(format string, args ...any) {
	f.out.Lock()
	defer f.out.Unlock()
	fmt.Printf(format+"\n", args...)
}

func (f *Fleet) init() { f.once.Do(func() { f.failed = make(chan error, 1) }) }

// Run runs stream(ctx, conn, i) for each of n streams, each in a goroutine of its own, over a
// new connection from dial every perConn streams; every progressEvery it prints what progress
// returns (nothing for ""). It returns nil once the driver closes standard input (or dies), or
// the first error of a stream or dial; either way after every stream has ended and every
// connection is closed.
func (f *Fleet) Run(n, perConn int, dial func() (*grpc.ClientConn, error), stream func(ctx context.Context, cc *grpc.ClientConn, i int) error,
	progressEvery time.Duration, progress func() string) error {
	f.init()
	ctx, cancel := benchproc.UntilStdinCloses(context.Background())
	defer func() {
		cancel()
		f.wg.Wait()
		for _, c := range f.conns {
			c.Close()
		}
	}()
	var conn *grpc.ClientConn
	for i := range n {
		if i%perConn == 0 {
			c, err := dial()
			if err != nil {
				return err
			}
			conn = c
			f.conns = append(f.conns, c)
		}
		cc := conn
		f.wg.Go(func() {
			if err := stream(ctx, cc, i); err != nil && ctx.Err() == nil {
				select {
				case f.failed <- err:
				default:
				}
			}
		})
	}
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-f.failed:
			return err
		case <-tick.C:
			if p := progress(); p != "" {
				f.Print("%s", p)
			}
		}
	}
}

// EachField calls fn with each length-delimited field of a message, skipping the others, and
// stops at fn's first error.
func EachField(b []byte, fn func(num protowire.Number, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, v); err != nil {
			return err
		}
	}
	return nil
}
