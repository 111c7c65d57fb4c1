package pgtest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Freeze stops the server and every one of its processes (SIGSTOP) without closing anything: a
// client's connections stay open and its queries, and new connections, wait with no answer, as
// on a database host that hangs. Thaw lets them go on. For fault injection (deploy's alert
// tests); Linux only, and only for a server this package started.
func (s *Server) Freeze() error { return s.signalAll(syscall.SIGSTOP) }

// Thaw continues a frozen server (SIGCONT).
func (s *Server) Thaw() error { return s.signalAll(syscall.SIGCONT) }

// signalAll sends sig to the postmaster first (so it forks nothing more), then to every process
// it started.
func (s *Server) signalAll(sig syscall.Signal) error {
	if s.external || s.proc == nil {
		return errors.New("pgtest: only a server this package started can be frozen")
	}
	pid := s.proc.Pid
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("pgtest: signal postgres %d: %w", pid, err)
	}
	children, err := childrenOf(pid)
	if err != nil {
		return err
	}
	for _, c := range children {
		if err := syscall.Kill(c, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("pgtest: signal postgres backend %d: %w", c, err)
		}
	}
	return nil
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) ([]int, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil || len(stats) == 0 {
		return nil, fmt.Errorf("pgtest: list processes (needs Linux's /proc): %v", err)
	}
	var out []int
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses, so read after the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
			out = append(out, child)
		}
	}
	return out, nil
}
