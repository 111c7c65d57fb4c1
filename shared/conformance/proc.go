package conformance

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// errNoProc is returned where the process table cannot be read (no /proc on this system).
var errNoProc = errors.New("the process table (/proc) cannot be read on this system")

// procStat is what the suite reads from /proc/PID/stat: the parent, the process group and the
// state letter.
type procStat struct {
	ppid, pgrp int
	state      byte
}

// readStat parses /proc/PID/stat. The command name may hold spaces and parentheses, so the
// fields are read after the last ')'.
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return procStat{}, false
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	pgrp, err2 := strconv.Atoi(string(f[2]))
	if err1 != nil || err2 != nil {
		return procStat{}, false
	}
	return procStat{ppid: ppid, pgrp: pgrp, state: f[0][0]}, true
}

// processes calls fn with every process in /proc.
func processes(fn func(pid int, st procStat)) error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return errNoProc
	}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(p); ok {
			fn(p, st)
		}
	}
	return nil
}

// descendants lists every process below pid (children, their children, ...), from /proc.
func descendants(pid int) ([]int, error) {
	children := map[int][]int{}
	if err := processes(func(p int, st procStat) { children[st.ppid] = append(children[st.ppid], p) }); err != nil {
		return nil, err
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out, nil
}

// groupMembers lists the processes of process group pgid other than its leader (pgid itself)
// that have not exited: what a plugin started in its own group, even after the plugin is gone.
func groupMembers(pgid int) []int {
	var out []int
	_ = processes(func(p int, st procStat) {
		if st.pgrp == pgid && p != pgid && st.state != 'Z' && st.state != 'X' {
			out = append(out, p)
		}
	})
	return out
}

// exited reports whether pid no longer runs: there is no such process, or it is a zombie that
// its parent has not reaped yet (it has exited all the same).
func exited(pid int) bool {
	if st, ok := readStat(pid); ok {
		return st.state == 'Z' || st.state == 'X'
	}
	if _, err := os.Stat("/proc"); err == nil {
		return true // /proc works and has no entry for pid
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		return true
	}
	return p.Signal(syscall.Signal(0)) != nil
}

// running returns the processes of pids that have not exited.
func running(pids []int) []int {
	var out []int
	for _, p := range pids {
		if !exited(p) {
			out = append(out, p)
		}
	}
	return out
}

// killAll sends SIGKILL to every process of pids; the suite cleans up what a plugin left behind.
func killAll(pids []int) {
	for _, pid := range pids {
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
		}
	}
}
