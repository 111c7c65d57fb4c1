package main

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"
)

// TestTheFollowerReadsTheFileOnceItsChangesSettle drives a follower with the events a directory
// watch would send, on real files, in fake time (settle 100ms).
func TestTheFollowerReadsTheFileOnceItsChangesSettle(t *testing.T) {
	const settle = 100 * time.Millisecond
	write := func(name, content string) func(*testing.T, string) {
		return func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, name), content) }
	}
	// configMap lays dir out as a Kubernetes ConfigMap volume: resources.yaml -> ..data/resources.yaml, ..data -> ..v1.
	configMap := func(t *testing.T, dir string) {
		must(t, os.Mkdir(filepath.Join(dir, "..v1"), 0o755))
		writeFile(t, filepath.Join(dir, "..v1", "resources.yaml"), "v1")
		must(t, os.Symlink("..v1", filepath.Join(dir, "..data")))
		must(t, os.Symlink("..data/resources.yaml", filepath.Join(dir, "resources.yaml")))
	}
	type step struct {
		do    func(*testing.T, string) // changes the directory (nil: nothing)
		event string                   // the event's file in the directory ("": no event)
		op    fsnotify.Op
		then  time.Duration // how long to wait after it
	}
	for _, c := range []struct {
		name   string
		setup  func(*testing.T, string) // nil: resources.yaml holds "first"
		reread time.Duration
		steps  []step
		want   []string // the contents read, in order
	}{
		{name: "a write in two steps within the settle time is read once, whole",
			steps: []step{{write("resources.yaml", "half"), "resources.yaml", fsnotify.Write, settle / 2},
				{write("resources.yaml", "whole"), "resources.yaml", fsnotify.Write, 2 * settle}},
			want: []string{"whole"}},
		{name: "two writes further apart than the settle time are read twice (why the file should be renamed into place)",
			steps: []step{{write("resources.yaml", "half"), "resources.yaml", fsnotify.Write, 2 * settle},
				{write("resources.yaml", "whole"), "resources.yaml", fsnotify.Write, 2 * settle}},
			want: []string{"half", "whole"}},
		{name: "a rename into place is read",
			steps: []step{{func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "new.tmp"), "renamed")
				must(t, os.Rename(filepath.Join(dir, "new.tmp"), filepath.Join(dir, "resources.yaml")))
			}, "resources.yaml", fsnotify.Create, 2 * settle}},
			want: []string{"renamed"}},
		{name: "a mode change alone is not read",
			steps: []step{{func(t *testing.T, dir string) { must(t, os.Chmod(filepath.Join(dir, "resources.yaml"), 0o600)) },
				"resources.yaml", fsnotify.Chmod, 2 * settle}}},
		{name: "another file of the directory is not read",
			steps: []step{{write("other.yaml", "other"), "other.yaml", fsnotify.Create, 2 * settle}}},
		{name: "a ConfigMap's ..data swap is read though no event names the file", setup: configMap,
			steps: []step{{func(t *testing.T, dir string) {
				must(t, os.Mkdir(filepath.Join(dir, "..v2"), 0o755))
				writeFile(t, filepath.Join(dir, "..v2", "resources.yaml"), "v2")
				must(t, os.Symlink("..v2", filepath.Join(dir, "..data_tmp")))
				must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
			}, "..data", fsnotify.Create, 2 * settle}},
			want: []string{"v2"}},
		{name: "without an event the file is re-read every --resources-reread", reread: time.Second,
			steps: []step{{write("resources.yaml", "unseen"), "", 0, time.Second + settle}},
			want:  []string{"unseen"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := NewWithT(t)
				dir := t.TempDir()
				if c.setup != nil {
					c.setup(t, dir)
				} else {
					writeFile(t, filepath.Join(dir, "resources.yaml"), "first")
				}
				file := filepath.Join(dir, "resources.yaml")
				var (
					mu    sync.Mutex
					reads []string
				)
				read := func() {
					b, err := os.ReadFile(file)
					if err != nil {
						t.Errorf("read: %v", err)
					}
					mu.Lock()
					reads = append(reads, string(b))
					mu.Unlock()
				}
				events := make(chan fsnotify.Event)
				f := (&follower{file: file, settle: settle, reread: c.reread, read: read, log: hclog.NewNullLogger()}).started()
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan struct{})
				go func() { f.run(ctx, events, nil); close(done) }()
				defer func() { cancel(); <-done }()

				for _, s := range c.steps {
					if s.do != nil {
						s.do(t, dir)
					}
					if s.event != "" {
						events <- fsnotify.Event{Name: filepath.Join(dir, s.event), Op: s.op}
					}
					time.Sleep(s.then)
				}
				synctest.Wait()
				mu.Lock()
				defer mu.Unlock()
				if c.want == nil {
					g.Expect(reads).To(BeEmpty())
				} else {
					g.Expect(reads).To(Equal(c.want))
				}
			})
		})
	}
}
