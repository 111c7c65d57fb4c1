package main

// The processes of the soak and their faults: replicas, zones, plugins, PostgreSQL and the
// fault proxies between zones and replicas.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one kds-host process the soak starts, kills and starts again.
type proc struct {
	name, log string
	args      []string
	ready     string // the URL that answers 200 once it serves

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	restarts int
	stopped  bool // SIGSTOPped
}

func (p *proc) start(bin string) error {
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlives the soak
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(exited)
	}()
	p.mu.Lock()
	p.cmd, p.exited, p.stopped = cmd, exited, false
	p.mu.Unlock()
	return nil
}

// waitReady waits until the process's ready URL answers 200, or d passes.
func (p *proc) waitReady(d time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if resp, err := client.Get(p.ready); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !p.running() {
			return fmt.Errorf("%s exited before it was ready; the end of %s:\n%s", p.name, p.log, tail(p.log))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready within %s; the end of %s:\n%s", p.name, d, p.log, tail(p.log))
}

func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill9 kills the process at once and waits for it.
func (p *proc) kill9() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.stopped = false
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// signal stops (SIGSTOP) or continues (SIGCONT) the process.
func (p *proc) signal(stop bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.stopped == stop {
		return
	}
	sig := syscall.SIGCONT
	if stop {
		sig = syscall.SIGSTOP
	}
	if p.cmd.Process.Signal(sig) == nil {
		p.stopped = stop
	}
}

func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// children are the pids of the process's children whose command name contains name (a plugin).
func children(ppid int, name string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after its closing parenthesis.
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(ppid) || !strings.Contains(s[:i], name) {
			continue
		}
		out = append(out, pid)
	}
	return out
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// freePort is a port free on 127.0.0.1 now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// proxyMode is what a fault proxy does with the bytes between a zone and a replica.
type proxyMode int

const (
	forward proxyMode = iota
	stall             // holds every byte, closes nothing
	drop              // closes every connection and refuses new ones
	delay             // forwards each chunk after a delay
)

// proxy is a TCP proxy from a zone to one replica that the soak makes misbehave.
type proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	mode    proxyMode
	changed chan struct{} // closed and replaced when the mode changes
	conns   map[net.Conn]bool
}

func newProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, changed: make(chan struct{}), conns: map[net.Conn]bool{}}
	go p.accept()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) close() {
	p.ln.Close()
	p.reset()
	p.set(forward)
}

func (p *proxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.current() == drop {
			in.Close()
			continue
		}
		out, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns[in], p.conns[out] = true, true
		p.mu.Unlock()
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

func (p *proxy) current() proxyMode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// set changes the mode; drop closes every connection too.
func (p *proxy) set(m proxyMode) {
	p.mu.Lock()
	p.mode = m
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
	if m == drop {
		p.reset()
	}
}

// reset closes every connection (each side sees a reset or an end).
func (p *proxy) reset() {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[net.Conn]bool{}
	p.mu.Unlock()
	for c := range conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // an RST, not a FIN
		}
		c.Close()
	}
}

func (p *proxy) pipe(from, to net.Conn) {
	defer func() {
		from.Close()
		to.Close()
		p.mu.Lock()
		delete(p.conns, from)
		delete(p.conns, to)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			for {
				p.mu.Lock()
				mode, changed := p.mode, p.changed
				p.mu.Unlock()
				if mode == stall {
					<-changed // hold the bytes until the mode changes
					continue
				}
				if mode == delay {
					time.Sleep(200 * time.Millisecond)
				}
				break
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			if tc, ok := to.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			return
		}
	}
}

// httpJSON is a client for the replicas' and zones' APIs, with a deadline on every call.
var httpJSON = &http.Client{Timeout: 10 * time.Second}
