// Package serial runs one owner's work one piece at a time, in order, without a goroutine of its
// own: a session's events (a response sent, an ACK, a NACK, a timer, a policy's answer) step its
// state through a Queue, so no lock is held while the work calls out, and nothing can overtake
// work queued before it.
package serial

import "sync"

// Queue runs the functions given to Do one at a time, in the order Do was called. The zero value
// is ready.
//
// Do runs f at once on the caller's goroutine when the queue is idle; otherwise it queues f and
// returns at once, and the goroutine running the queue runs f after what was queued before it.
// So a caller (an xDS callback) never waits for another's work, and f may itself call Do (its
// function runs after f returns, on the same goroutine). This is Istio's push queue for one
// connection: work that arrives while the connection is busy is run by the worker already on it.
type Queue struct {
	mu      sync.Mutex // guards busy and pending; never held while work runs
	busy    bool
	pending []func()
}

// Do runs f after every function given to Do before it.
func (q *Queue) Do(f func()) {
	q.mu.Lock()
	if q.busy {
		q.pending = append(q.pending, f)
		q.mu.Unlock()
		return
	}
	q.busy = true
	q.mu.Unlock()
	for {
		f()
		q.mu.Lock()
		if len(q.pending) == 0 {
			q.busy, q.pending = false, nil
			q.mu.Unlock()
			return
		}
		f = q.pending[0]
		q.pending[0] = nil
		q.pending = q.pending[1:]
		q.mu.Unlock()
	}
}
