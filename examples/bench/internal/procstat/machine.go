package procstat

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// Machine is what a bench report says of the machine and the run: the CPUs, memory, kernel, Go
// and commit, when it started and finished and the load averages then.
type Machine struct {
	CPUs        int    `json:"cpus"`
	MemTotal    uint64 `json:"mem_total_bytes"`
	Kernel      string `json:"kernel"`
	Go          string `json:"go"`
	Commit      string `json:"commit"`
	Started     string `json:"started"`
	Finished    string `json:"finished"`
	LoadStart   string `json:"load_average_start"`
	LoadEnd     string `json:"load_average_end"`
	Description string `json:"description"`
}

// NewMachine describes the machine as a run starts (the commit: git describe's, in the current
// directory).
func NewMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), MemTotal: Meminfo("MemTotal:"), Go: runtime.Version(),
		Started: time.Now().UTC().Format(time.RFC3339), LoadStart: LoadAvg()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(b))
	}
	return m
}

// Finish notes the end of the run, and writes the Description.
func (m *Machine) Finish() {
	m.Finished = time.Now().UTC().Format(time.RFC3339)
	m.LoadEnd = LoadAvg()
	m.Description = fmt.Sprintf("%d CPUs, %.1f GiB, Linux %s, %s; load average %s at the start, %s at the end",
		m.CPUs, float64(m.MemTotal)/(1<<30), m.Kernel, m.Go, m.LoadStart, m.LoadEnd)
}
