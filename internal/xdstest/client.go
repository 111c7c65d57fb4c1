package xdstest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v3statusgrpc "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kds-host/kds-host/internal/testbin"
)

// ChildCommand is one command line to the child (./cmd/xdsclient).
type ChildCommand struct {
	Op       string        `json:"op"` // start, take, stop
	Interval time.Duration `json:"interval,omitempty"`
	Deadline time.Duration `json:"deadline,omitempty"`
}

// ChildReply is the child's answer to one ChildCommand.
type ChildReply struct {
	Counts Counts `json:"counts"`
	Error  string `json:"error,omitempty"`
}

// Bootstrap is the bootstrap JSON of a client of the management server at addr: insecure channel
// creds, server_features ["xds_v3"], node id nodeID.
func Bootstrap(addr, nodeID string) []byte {
	b, err := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      addr,
			"channel_creds":   []any{map[string]string{"type": "insecure"}},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]any{"id": nodeID, "locality": map[string]string{"region": "local"}},
	})
	if err != nil {
		panic(err)
	}
	return b
}

// clientBinary returns the child program: $XDSTEST_CLIENT_BIN, or ./cmd/xdsclient built once per
// process (testbin.BuildPkg, from the module root: the go command must find the module).
func clientBinary() (string, error) {
	if p := os.Getenv("XDSTEST_CLIENT_BIN"); p != "" {
		return p, nil
	}
	return testbin.BuildPkg("./internal/xdstest/cmd/xdsclient")
}

// RemoveBuiltClient removes the child program built by this process, if any (call it from
// TestMain after the tests, or at the end of a program): testbin.Cleanup.
func RemoveBuiltClient() { testbin.Cleanup() }

// Client is a grpc-go xDS client of one management server, in its own process, dialing Target.
type Client struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Scanner
	stderr *strings.Builder
	csds   string
	mu     sync.Mutex
	waited chan struct{}
}

// StartClient starts a client bootstrapped (GRPC_XDS_BOOTSTRAP_CONFIG) on the server at serverAddr
// with node id NodeID. It returns when the client serves CSDS; it has not necessarily any
// resource yet (see WaitBackend).
func StartClient(serverAddr string) (*Client, error) {
	bin, err := clientBinary()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "GRPC_XDS_BOOTSTRAP_CONFIG="+string(Bootstrap(serverAddr, NodeID)))
	cmd.Env = append(cmd.Env, "GRPC_GO_LOG_SEVERITY_LEVEL=error")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c := &Client{cmd: cmd, stdin: stdin, stdout: bufio.NewScanner(stdout), stderr: &strings.Builder{}, waited: make(chan struct{})}
	cmd.Stderr = &lockedWriter{w: c.stderr}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { cmd.Wait(); close(c.waited) }()
	var hello struct{ CSDS string }
	if !c.stdout.Scan() {
		c.Close()
		return nil, fmt.Errorf("xdstest: client exited: %s", c.Stderr())
	}
	if err := json.Unmarshal(c.stdout.Bytes(), &hello); err != nil || hello.CSDS == "" {
		c.Close()
		return nil, fmt.Errorf("xdstest: client said %q: %v", c.stdout.Text(), err)
	}
	c.csds = hello.CSDS
	return c, nil
}

type lockedWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w.Len() > 1<<20 {
		return len(p), nil
	}
	return l.w.Write(p)
}

// Stderr is what the child wrote on stderr so far (grpc-go's logs at error level, 1 MiB at most).
func (c *Client) Stderr() string {
	lw := c.cmd.Stderr.(*lockedWriter)
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.w.String()
}

func (c *Client) do(cmd ChildCommand) (Counts, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, _ := json.Marshal(cmd)
	if _, err := c.stdin.Write(append(b, '\n')); err != nil {
		return Counts{}, fmt.Errorf("xdstest: client: %v (stderr: %s)", err, c.Stderr())
	}
	if !c.stdout.Scan() {
		return Counts{}, fmt.Errorf("xdstest: client exited (stderr: %s)", c.Stderr())
	}
	var r ChildReply
	if err := json.Unmarshal(c.stdout.Bytes(), &r); err != nil {
		return Counts{}, err
	}
	if r.Error != "" {
		return r.Counts, errors.New(r.Error)
	}
	return r.Counts, nil
}

// StartLoop starts the RPC loop in the client (Interval, Deadline); a second call does nothing.
func (c *Client) StartLoop() error {
	_, err := c.do(ChildCommand{Op: "start"})
	return err
}

// Take returns the loop's counts since the last Take and starts counting afresh.
func (c *Client) Take() (Counts, error) { return c.do(ChildCommand{Op: "take"}) }

// StopLoop stops the loop and returns its counts since the last Take.
func (c *Client) StopLoop() (Counts, error) { return c.do(ChildCommand{Op: "stop"}) }

// WaitBackend runs the loop until an RPC is served by backend, or ctx ends; the counts of the
// wait are dropped.
func (c *Client) WaitBackend(ctx context.Context, backend string) error {
	if err := c.StartLoop(); err != nil {
		return err
	}
	var last Counts
	for {
		n, err := c.Take()
		if err != nil {
			return err
		}
		last.Add(n)
		if n.ByBackend[backend] > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("xdstest: no RPC served by %s: %s", backend, last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close stops the client process and waits for it.
func (c *Client) Close() error {
	c.stdin.Close()
	select {
	case <-c.waited:
	case <-time.After(3 * time.Second):
		c.cmd.Process.Kill()
		<-c.waited
	}
	return nil
}

// ResourceStatus is the client's view of one resource, from CSDS.
type ResourceStatus struct {
	TypeURL string
	Name    string
	Status  string // ACKED, NACKED, REQUESTED, DOES_NOT_EXIST, ...
	Version string
	// NACK is the error detail of the last NACK of this resource, if any.
	NACK string
	// NACKVersion is the version that was NACKed.
	NACKVersion string
}

// CSDS asks the client's CSDS service for every resource it knows.
func (c *Client) CSDS(ctx context.Context) ([]ResourceStatus, error) {
	return QueryCSDS(ctx, c.csds)
}

// QueryCSDS asks the CSDS service at addr (plaintext) for every resource of every client scope.
func QueryCSDS(ctx context.Context, addr string) ([]ResourceStatus, error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	resp, err := v3statusgrpc.NewClientStatusDiscoveryServiceClient(cc).FetchClientStatus(ctx, &v3statusgrpc.ClientStatusRequest{})
	if err != nil {
		return nil, err
	}
	var out []ResourceStatus
	for _, cfg := range resp.GetConfig() {
		for _, g := range cfg.GetGenericXdsConfigs() {
			out = append(out, ResourceStatus{
				TypeURL:     g.GetTypeUrl(),
				Name:        g.GetName(),
				Status:      g.GetClientStatus().String(),
				Version:     g.GetVersionInfo(),
				NACK:        g.GetErrorState().GetDetails(),
				NACKVersion: g.GetErrorState().GetVersionInfo(),
			})
		}
	}
	return out, nil
}

// Find returns the status of (typeURL, name) in rs, and whether it is there.
func Find(rs []ResourceStatus, typeURL, name string) (ResourceStatus, bool) {
	for _, r := range rs {
		if r.TypeURL == typeURL && r.Name == name {
			return r, true
		}
	}
	return ResourceStatus{}, false
}

// CPU is the CPU time the client process has used so far (user and system, from /proc), or 0
// where /proc cannot tell.
func (c *Client) CPU() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// The fields after the command name (which may hold spaces) start after the last ')'.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ is 100 on Linux
}

// processCPU is the CPU time this process has used so far (user and system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
