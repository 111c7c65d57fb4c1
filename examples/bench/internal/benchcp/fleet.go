package benchcp

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// Fleet is a zones' process: this program run again (with a -fleet flag of its own), which
// prints "synced" once its zones hold what they should, and closes its streams and exits when its
// standard input closes. Running the zones in another process keeps their CPU and memory out of
// the figures of the process that measures.
type Fleet struct {
	Cmd   *exec.Cmd
	Out   *bufio.Reader // what the process prints after "synced"
	stdin io.WriteCloser
}

// StartFleet runs this program again with args (its standard error ours) and returns once it
// printed "synced"; a process that ends or prints anything else first is killed.
func StartFleet(args ...string) (*Fleet, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	out := bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "synced" {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("the zones' process did not sync: %q %v", line, err)
	}
	return &Fleet{Cmd: cmd, Out: out, stdin: stdin}, nil
}

// Close asks the process to stop (its standard input closes) and waits for it.
func (f *Fleet) Close() error {
	f.stdin.Close()
	return f.Cmd.Wait()
}

// Send writes a line to the process's standard input.
func (f *Fleet) Send(line string) error {
	_, err := io.WriteString(f.stdin, line+"\n")
	return err
}
