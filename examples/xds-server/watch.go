package main

import (
	"context"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"
)

// dirWatch is what a follower asks of fsnotify.Watcher: watch a directory, or stop watching it.
type dirWatch interface {
	Add(name string) error
	Remove(name string) error
}

// follower calls read when the resources file may have changed:
//   - once settle has passed without an event about the file, after one (a write in several
//     steps within settle is read once, whole);
//   - every reread, whatever the events (a filesystem without inotify, a lost event; 0: never).
//
// An event is about the file when it names the file or the file its symbolic links lead to, or
// when the links now lead elsewhere (a Kubernetes ConfigMap's ..data swap names neither).
// Mode and time changes alone are not.
type follower struct {
	file   string // absolute
	settle time.Duration
	reread time.Duration
	read   func()
	log    hclog.Logger
	watch  *fsnotify.Watcher // of the file's directory; nil without inotify
	dirs   dirWatch          // watch, or nil (a test)

	// Owned by run's goroutine (started's before).
	real    string // the path the file resolved to at the last event ("" if it did not)
	realDir string // the directory of real watched besides the file's own ("" none)
}

// newFollower watches the file's directory with fsnotify from now on; follow reports what it
// sees, close ends the watch. Without inotify the file is re-read every reread only, and a
// warning says so.
func newFollower(file string, settle, reread time.Duration, read func(), log hclog.Logger) *follower {
	abs, err := filepath.Abs(file)
	if err != nil {
		abs = file
	}
	f := &follower{file: abs, settle: settle, reread: reread, read: read, log: log}
	w, err := fsnotify.NewWatcher()
	if err == nil {
		if err = w.Add(filepath.Dir(abs)); err != nil {
			w.Close()
		}
	}
	if err != nil {
		log.Warn("cannot watch the resources file's directory; it is re-read every --resources-reread only",
			"dir", filepath.Dir(abs), "reread", reread, "error", err)
		return f.started()
	}
	f.watch, f.dirs = w, w
	return f.started()
}

// started notes where the file's links lead now, before the file is first read: an event that
// moves them from there is about the file.
func (f *follower) started() *follower {
	f.real = f.resolve()
	return f
}

// follow calls read as the follower's contract says until ctx ends.
func (f *follower) follow(ctx context.Context) {
	if f.watch == nil {
		f.run(ctx, nil, nil)
		return
	}
	f.run(ctx, f.watch.Events, f.watch.Errors)
}

// close ends the directory watch.
func (f *follower) close() {
	if f.watch != nil {
		f.watch.Close()
	}
}

// run calls read until ctx ends, on the events and errors of a directory watch (nil: none).
func (f *follower) run(ctx context.Context, events <-chan fsnotify.Event, errs <-chan error) {
	settled := time.NewTimer(time.Hour)
	settled.Stop()
	defer settled.Stop()
	var tick <-chan time.Time
	if f.reread > 0 {
		t := time.NewTicker(f.reread)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				f.log.Warn("the resources file's watch ended; it is re-read every --resources-reread only", "reread", f.reread)
				continue
			}
			if f.about(ev) {
				settled.Reset(f.settle)
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			f.log.Warn("watching the resources file: an event may be lost; reading it again", "file", f.file, "error", err)
			settled.Reset(f.settle)
		case <-settled.C:
			f.read()
		case <-tick:
			f.read()
		}
	}
}

// about says whether ev may change what the file reads.
func (f *follower) about(ev fsnotify.Event) bool {
	if ev.Op == fsnotify.Chmod {
		return false
	}
	real := f.resolve()
	moved := real != f.real
	f.real = real
	name := filepath.Clean(ev.Name)
	return moved || name == f.file || (real != "" && name == real)
}

// resolve returns the path the file's symbolic links lead to ("" if it does not resolve), and
// watches that path's directory too when it is not the file's own.
func (f *follower) resolve() string {
	real, err := filepath.EvalSymlinks(f.file)
	if err != nil {
		return ""
	}
	dir := filepath.Dir(real)
	if f.dirs == nil || dir == filepath.Dir(f.file) || dir == f.realDir {
		return real
	}
	if f.realDir != "" {
		_ = f.dirs.Remove(f.realDir) // it may be gone already (a ConfigMap's previous version)
		f.realDir = ""
	}
	if err := f.dirs.Add(dir); err != nil {
		f.log.Debug("cannot watch the directory the resources file leads to; its changes in place are seen by the re-read", "dir", dir, "error", err)
		return real
	}
	f.realDir = dir
	return real
}
