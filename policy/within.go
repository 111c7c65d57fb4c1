package policy

import (
	"context"
	"time"

	"github.com/kds-host/kds-host/internal/within"
)

// MaxAbandoned is how many calls of one policy Within leaves running after their deadline.
// While that many run, a call fails at once.
const MaxAbandoned = within.MaxAbandoned

// ErrTooManyAbandoned is what a call fails with, at once, while MaxAbandoned calls of its
// policy run on after their deadline: the policy ignores its context, and its caller falls back.
var ErrTooManyAbandoned = within.ErrTooManyAbandoned

// Abandoned counts the calls of one policy that Within gave up on at their deadline and that
// have not returned yet. The zero value is ready; each policy has its own.
type Abandoned = within.Abandoned

// Within calls call with a context that ends at d from now (with ctx's end, if sooner; with
// ctx's only when d <= 0) and returns its answer. When that context ends first, Within returns
// at once with an error that wraps context.DeadlineExceeded or context.Canceled: the call is
// abandoned, runs on in its goroutine until it returns on its own, and is counted in a until
// then. While a counts MaxAbandoned calls, Within does not call and fails at once with an error
// that wraps ErrTooManyAbandoned; so it does when ctx has ended. A call that panics fails with an
// error that says so. The guard and kds-host bound their policies' calls with it.
func Within[T any](ctx context.Context, a *Abandoned, d time.Duration, call func(context.Context) (T, error)) (T, error) {
	return within.Do(ctx, a, d, call)
}
