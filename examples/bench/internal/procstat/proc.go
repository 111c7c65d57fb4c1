// Package procstat is what the bench drivers under examples/bench share: what they read of the
// processes they start (a child process's lines and stop, its CPU time, page faults, system
// calls and memory, from /proc), the machine (memory, load, what a report says of it), and the
// order of interleaved runs.
package procstat

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kds-host/kds-host/examples/bench/internal/benchcp"
)

// Child is a process this program started: its standard output arrives line by line on lines,
// and closing its standard input tells it to stop.
type Child struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	mu    sync.Mutex
	last  map[string]string // the last line skipped by expect, by its first word
	done  chan struct{}     // closed once the process has exited; err is then set
	err   error
}

// StartChild starts path with args; its standard error goes to ours. On Linux it is killed if
// this program dies (Pdeathsig), and closing its standard input asks it to stop.
func StartChild(name, path string, args ...string) (*Child, error) {
	cmd := exec.Command(path, args...)
	cmd.Stderr = os.Stderr
	setDeathSignal(cmd)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &Child{name: name, cmd: cmd, stdin: stdin, lines: make(chan string, 1024), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		c.err = cmd.Wait() // after the last read of stdout, as Wait requires
		close(c.done)
	}()
	return c, nil
}

func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Signal sends sig to the child (a server that stops on SIGTERM rather than on its standard
// input closing); Stop then waits for it.
func (c *Child) Signal(sig os.Signal) error { return c.cmd.Process.Signal(sig) }

// Expect returns the next line of the child that starts with prefix (other lines are skipped),
// or an error when the child exits, timeout passes or ctx ends first.
func (c *Child) Expect(ctx context.Context, prefix string, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case line := <-c.lines:
			if strings.HasPrefix(line, prefix) {
				return line, nil
			}
			c.skipped(line)
		case <-c.done:
			select { // a line printed just before the exit
			case line := <-c.lines:
				if strings.HasPrefix(line, prefix) {
					return line, nil
				}
				continue
			default:
			}
			return "", fmt.Errorf("%s exited (%v) before printing %q", c.name, c.err, prefix)
		case <-t.C:
			return "", fmt.Errorf("%s printed no %q within %s", c.name, prefix, timeout)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

func (c *Child) skipped(line string) {
	word, _, _ := strings.Cut(line, " ")
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[string]string{}
	}
	c.last[word+" "] = line
}

// LastLine is the last line Expect skipped that starts with prefix, a first word and a space.
func (c *Child) LastLine(prefix string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last[prefix]
}

// Stop closes the child's standard input and waits for it to exit, at most timeout, then kills
// it. A second call returns at once.
func (c *Child) Stop(timeout time.Duration) error {
	if c == nil {
		return nil
	}
	c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("%s did not stop within %s: killed", c.name, timeout)
	}
	var exit *exec.ExitError
	if errors.As(c.err, &exit) {
		return fmt.Errorf("%s: %w", c.name, c.err)
	}
	return nil
}

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// CPUOf is the CPU time (user and system) a process has used: the sum of its threads' time on
// a CPU from /proc/PID/task/*/schedstat (nanoseconds), or, when that is off by more than two
// clock ticks from /proc/PID/stat's utime+stime (a thread exited, or schedstat is missing),
// the latter, at a resolution of one clock tick.
func CPUOf(pid int) (time.Duration, error) {
	coarse, err := statCPU(pid)
	if err != nil {
		return 0, err
	}
	fine, err := schedstatCPU(pid)
	if err != nil || fine-coarse > 2*clockTick || coarse-fine > 2*clockTick {
		return coarse, nil
	}
	return fine, nil
}

func statCPU(pid int) (time.Duration, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	// After the name: state(3) ... utime(14) stime(15), so f[11] and f[12].
	var ticks int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// MinorFaultsOf is the page faults a process has taken that read nothing from disk (minflt): its
// first touches of memory, each priced by the machine (examples/bench/machine's first touch).
func MinorFaultsOf(pid int) (int64, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(f[7], 10, 64) // minflt(10)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return n, nil
}

// SyscallsOf is the read and write system calls a process has made (syscr and syscw of
// /proc/PID/io: read(2), write(2) and their vector and socket kin): a server's sends and
// receives, whose frames grpc-go batches into as few as it can.
func SyscallsOf(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, err
	}
	var n int64
	found := 0
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if !ok || (k != "syscr" && k != "syscw") {
			continue
		}
		c, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/io: %s: %w", pid, k, err)
		}
		n += c
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("/proc/%d/io: no syscr and syscw", pid)
	}
	return n, nil
}

// statFields is /proc/PID/stat's fields after the command name: state(3) first.
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return nil, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	return f, nil
}

func schedstatCPU(pid int) (time.Duration, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/schedstat")
		if err != nil {
			continue // the thread exited meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, fmt.Errorf("%s/%s/schedstat: empty", dir, t.Name())
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, err
		}
		sum += time.Duration(ns)
	}
	return sum, nil
}

// MemOf reads a process's resident set now (VmRSS) and at its peak (VmHWM), in bytes.
func MemOf(pid int) (rss, hwm uint64, err error) { return benchcp.ProcStatusOf(strconv.Itoa(pid)) }

// MemAvailable is MemAvailable from /proc/meminfo, in bytes (0 when unknown).
func MemAvailable() uint64 { return Meminfo("MemAvailable:") }

// Meminfo is a field of /proc/meminfo (such as "MemTotal:"), in bytes (0 when unknown).
func Meminfo(field string) uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// LoadAvg is the machine's load averages over 1, 5 and 15 minutes ("" when unknown).
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// Quiet waits until the process has used less than 3 ms of CPU over 300 ms (1 %), at most max:
// what a step started has finished before the next is measured.
func Quiet(ctx context.Context, pid int, max time.Duration) {
	deadline := time.Now().Add(max)
	last, _ := CPUOf(pid)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		Sleep(ctx, 300*time.Millisecond)
		now, err := CPUOf(pid)
		if err != nil || now-last < 3*time.Millisecond {
			return
		}
		last = now
	}
}

// Sleep waits d, or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Median of sorted values (the mean of the middle two for an even count).
func Median(sorted []float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}
