// Package lograte writes at most a few log lines of one kind a period, and then one line that
// says how many it left out: a flood of refusals costs the log a few lines, not one each.
package lograte

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Log writes through a *slog.Logger at most Burst lines of each key in a window of Period,
// which starts with the key's first line. It counts the lines past them, and when the window
// ends it writes one line that says how many it left out (at the level and with the message of
// the last one, and the key under KeyName). Close ends the windows. A Log is safe for use by
// several goroutines, and writes with no lock held.
type Log struct {
	log     *slog.Logger
	period  time.Duration
	burst   int
	keyName string

	mu     sync.Mutex         // guards keys and closed
	keys   map[string]*window // the keys with a window open
	closed bool
}

// window is one key's window: the lines written in it, and those left out.
type window struct {
	timer   *time.Timer
	written int
	left    int
	level   slog.Level
	msg     string
}

// New returns a Log that writes to log at most burst lines of each key a period (defaults: 5
// lines a second); keyName names the key in the line that counts what was left out. A nil log
// discards.
func New(log *slog.Logger, period time.Duration, burst int, keyName string) *Log {
	if period <= 0 {
		period = time.Second
	}
	if burst <= 0 {
		burst = 5
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Log{log: log, period: period, burst: burst, keyName: keyName, keys: map[string]*window{}}
}

// Log writes msg with args at level, unless key has had its lines in its window: then it counts
// it. It reports whether it wrote it.
func (l *Log) Log(key string, level slog.Level, msg string, args ...any) bool {
	l.mu.Lock()
	w := l.keys[key]
	switch {
	case l.closed:
	case w == nil:
		w = &window{written: 1}
		l.keys[key] = w
		w.timer = time.AfterFunc(l.period, func() { l.end(key, w) })
	case w.written < l.burst:
		w.written++
	default:
		w.left++
		w.level, w.msg = level, msg
		l.mu.Unlock()
		return false
	}
	l.mu.Unlock()
	l.log.Log(context.Background(), level, msg, args...)
	return true
}

// end closes key's window w and writes how many lines it left out, if any.
func (l *Log) end(key string, w *window) {
	l.mu.Lock()
	if l.keys[key] == w {
		delete(l.keys, key)
	}
	left, level, msg := w.left, w.level, w.msg
	w.left = 0
	l.mu.Unlock()
	if left > 0 {
		l.log.Log(context.Background(), level, fmt.Sprintf("%s: %d more not logged in %s", msg, left, l.period), l.keyName, key)
	}
}

// Close ends every window, writing how many lines each left out; later lines are all written.
func (l *Log) Close() {
	l.mu.Lock()
	l.closed = true
	open := l.keys
	l.keys = map[string]*window{}
	l.mu.Unlock()
	for key, w := range open {
		if w.timer.Stop() { // else its end runs, or ran
			l.end(key, w)
		}
	}
}
