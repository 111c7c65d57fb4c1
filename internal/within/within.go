// Package within bounds a call to a policy by a deadline, even when the policy ignores its context.
package within

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// MaxAbandoned is how many calls of one policy Do leaves running after their deadline.
// While that many run, a call fails at once.
const MaxAbandoned = 4

// ErrTooManyAbandoned is what a call fails with, at once, while MaxAbandoned calls of its
// policy run on after their deadline: the policy ignores its context, and its caller falls back.
var ErrTooManyAbandoned = errors.New("too many calls of this policy still run after their deadline: it ignores its context")

// Abandoned counts the calls of one policy that Do gave up on at their deadline and that
// have not returned yet. The zero value is ready; each policy has its own.
type Abandoned struct{ n atomic.Int64 }

// Running is how many abandoned calls have not returned yet.
func (a *Abandoned) Running() int { return int(a.n.Load()) }

// Do calls call with a context that ends at d from now (with ctx's end, if sooner; with
// ctx's only when d <= 0) and returns its answer. When that context ends first, Do returns
// at once with an error that wraps context.DeadlineExceeded or context.Canceled: the call is
// abandoned, runs on in its goroutine until it returns on its own, and is counted in a until
// then. While a counts MaxAbandoned calls, Do does not call and fails at once with an error
// that wraps ErrTooManyAbandoned; so it does when ctx has ended. A call that panics fails with an
// error that says so.
func Do[T any](ctx context.Context, a *Abandoned, d time.Duration, call func(context.Context) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, fmt.Errorf("policy call not made: %w", err)
	}
	if n := a.Running(); n >= MaxAbandoned {
		return zero, fmt.Errorf("policy call not made: %d calls abandoned at their deadline still run: %w", n, ErrTooManyAbandoned)
	}
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if d > 0 {
		cctx, cancel = context.WithTimeout(ctx, d)
	}
	type answer struct {
		v   T
		err error
	}
	done := make(chan answer, 1) // the call never waits on it, answered or abandoned
	var state atomic.Int32       // running, then answered or abandoned, whichever comes first
	const (
		running int32 = iota
		answered
		abandoned
	)
	go func() {
		defer cancel()
		var r answer
		defer func() {
			if p := recover(); p != nil {
				r = answer{zero, fmt.Errorf("policy call panicked: %v", p)}
			}
			if !state.CompareAndSwap(running, answered) {
				a.n.Add(-1)
			}
			done <- r
		}()
		r.v, r.err = call(cctx)
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-cctx.Done():
	}
	a.n.Add(1)
	if !state.CompareAndSwap(running, abandoned) {
		a.n.Add(-1) // it answered as the deadline passed: take the answer
		r := <-done
		return r.v, r.err
	}
	if ctx.Err() == nil {
		return zero, fmt.Errorf("policy call abandoned at its %s deadline: %w", d, cctx.Err())
	}
	return zero, fmt.Errorf("policy call abandoned: %w", cctx.Err())
}
