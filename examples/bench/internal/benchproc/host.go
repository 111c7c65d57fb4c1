package benchproc

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Host is a kds-host global started as its own process, on loopback ports of its own, with a
// temporary data dir (SQLite), plaintext KDS and no zone authentication: what a bench measures
// from the outside.
type Host struct {
	KDSAddr, APIAddr, DiagAddr, DataDir string
	cmd                                 *exec.Cmd
}

// StartHost starts bin as a global, with more flags, and waits until /readyz answers.
func StartHost(bin string, flags ...string) (*Host, error) {
	return StartHostLogging(bin, os.Stderr, flags...)
}

// StartHostLogging is StartHost with the global's log (its standard error) written to logs.
func StartHostLogging(bin string, logs io.Writer, flags ...string) (*Host, error) {
	dir, err := os.MkdirTemp("", "kds-bench-host-")
	if err != nil {
		return nil, err
	}
	h := &Host{DataDir: dir}
	for _, a := range []*string{&h.KDSAddr, &h.APIAddr, &h.DiagAddr} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		*a = ln.Addr().String()
		ln.Close()
	}
	args := append([]string{"--mode", "global", "--data-dir", dir, "--kds-plaintext", "--kds-auth", "none", "--kds-addr", h.KDSAddr,
		"--api-addr", h.APIAddr, "--diag-addr", h.DiagAddr, "--log-level", "error"}, flags...)
	h.cmd = exec.Command(bin, args...)
	h.cmd.Stderr = logs
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := h.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	client := &http.Client{Timeout: time.Second}
	for i := 0; ; i++ {
		if resp, err := client.Get("http://" + h.DiagAddr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return h, nil
			}
		}
		if i > 200 {
			h.Stop()
			return nil, fmt.Errorf("the global did not become ready within 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop kills the global and removes its data dir.
func (h *Host) Stop() {
	h.cmd.Process.Kill()
	h.cmd.Wait()
	os.RemoveAll(h.DataDir)
}

// Pid is the global's process id.
func (h *Host) Pid() int { return h.cmd.Process.Pid }

// CPU is the global's user and system CPU so far (/proc/PID/stat, in clock ticks of 10 ms).
func (h *Host) CPU() time.Duration {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(h.Pid()), "stat"))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// PeakRSS is the global's peak resident set (VmHWM), in bytes.
func (h *Host) PeakRSS() float64 { return h.status("VmHWM:") }

// RSS is the global's resident set now (VmRSS), in bytes.
func (h *Host) RSS() float64 { return h.status("VmRSS:") }

// status reads a size field of the global's /proc/PID/status, in bytes.
func (h *Host) status(field string) float64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(h.Pid()), "status"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb * 1024
		}
	}
	return 0
}
