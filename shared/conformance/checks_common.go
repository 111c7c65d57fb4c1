package conformance

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-plugin"
	"github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcpeer "google.golang.org/grpc/peer"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/launch"
)

var handshakeCheck = check{
	name:    CheckHandshake,
	summary: "starts with the kds-host handshake (magic cookie, protocol 1, gRPC), talks AutoMTLS, answers health and serves a plugin kind",
	run: func(c *checkRun) {
		c.broken = "the plugin did not start (see handshake)"
		c.handshakeFailed = true
		if _, err := os.Stat(c.opts.Path); err != nil {
			c.failf("cannot run the plugin: %v", err)
		}
		if abs, err := filepath.Abs(c.opts.Path); err == nil {
			c.opts.Path = abs // a bare name is a file here, not a command on PATH
		}
		p, rpc, err := c.start(c.ctx, nil)
		if err != nil {
			c.failf("%s", explainStart(err))
		}
		c.proc = p
		client := p.Client()
		c.broken = "the host cannot talk to the plugin (see handshake)"
		if v := client.NegotiatedVersion(); v != shared.ProtocolVersion {
			c.failf("the plugin negotiated protocol version %d; kds-host speaks %d (%s)", v, shared.ProtocolVersion, docSection("handshake"))
		}
		if client.Protocol() != plugin.ProtocolGRPC {
			c.failf("the plugin serves %s; kds-host plugins serve gRPC, the fifth field of the handshake line (%s)", client.Protocol(), docSection("handshake"))
		}
		gc, ok := rpc.(*plugin.GRPCClient)
		if !ok {
			c.failf("the plugin's connection is %T, not gRPC", rpc)
		}
		transport := c.talk(gc.Conn)
		c.kinds = c.servedKinds(rpc)
		if len(c.kinds) == 0 {
			c.failf("the plugin serves neither %s nor %s: serve one with shared.ServeRetryForcer or shared.ServeOwnerCheck (%s)",
				pluginv1.RetryForcer_ServiceDesc.ServiceName, pluginv1.OwnerCheck_ServiceDesc.ServiceName, docSection("services"))
		}
		if slices.Contains(c.kinds, KindRetryForcer) {
			c.rf = dispense[shared.RetryForcer](c, rpc, shared.RetryForcerName)
		}
		if slices.Contains(c.kinds, KindOwnerCheck) {
			c.oc = dispense[shared.OwnerCheck](c, rpc, shared.OwnerCheckName)
		}
		c.broken, c.handshakeFailed = "", false
		c.notef("pid %d, protocol %d over gRPC, %s, serves %s", p.Pid(), client.NegotiatedVersion(), transport, strings.Join(c.kinds, " and "))
	},
}

// ProtocolDoc is the document that specifies the plugin protocol; failures name its sections.
const ProtocolDoc = launch.ProtocolDoc

// docSection names a section of ProtocolDoc for a failure message.
func docSection(anchor string) string { return launch.DocSection(anchor) }

// talk makes the first call a host makes, go-plugin's health check, and says what the plugin
// negotiated: AutoMTLS, with its TLS version and certificate. A plugin the host cannot talk to
// fails the check with what to implement: most often AutoMTLS, when the plugin serves plaintext.
func (c *checkRun) talk(conn *grpc.ClientConn) string {
	ctx, cancel := context.WithTimeout(c.ctx, c.opts.CallTimeout)
	defer cancel()
	var peer grpcpeer.Peer
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: plugin.GRPCServiceName}, grpc.Peer(&peer))
	switch {
	case err == nil:
	case status.Code(err) == codes.Unimplemented:
		c.failf("the plugin does not serve the gRPC health service: the host calls grpc.health.v1.Health/Check with service %q and wants SERVING (%s)",
			plugin.GRPCServiceName, docSection("health"))
	default:
		if e := c.proc.Unreachable(c.ctx, err, c.opts.CallTimeout); e != nil {
			c.failf("%v", e)
		}
		c.failf("the host cannot talk to the plugin: %v (%s)", err, docSection("automtls"))
	}
	tlsInfo, ok := peer.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "plaintext"
	}
	desc := "AutoMTLS (" + tls.VersionName(tlsInfo.State.Version)
	if certs := tlsInfo.State.PeerCertificates; len(certs) > 0 {
		desc += fmt.Sprintf(", the plugin's certificate for %s, %s", strings.Join(certs[0].DNSNames, ","), x509.PublicKeyAlgorithm(certs[0].PublicKeyAlgorithm))
	}
	return desc + ")"
}

func dispense[T any](c *checkRun, rpc plugin.ClientProtocol, name string) T {
	raw, err := rpc.Dispense(name)
	if err != nil {
		c.failf("dispense %s: %v", name, err)
	}
	impl, ok := raw.(T)
	if !ok {
		c.failf("dispense %s: got %T", name, raw)
	}
	return impl
}

// explainStart adds to the launcher's start error what a plugin author should do about it.
func explainStart(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "This binary is a plugin"): // go-plugin's words on its stderr
		return fmt.Sprintf("the plugin exited at start: it did not find the magic cookie it expects. kds-host sets %s=%s (shared.Handshake); serve the plugin with shared.ServeRetryForcer, shared.ServeOwnerCheck or shared.Serve, which expect it: %s",
			shared.Handshake.MagicCookieKey, shared.Handshake.MagicCookieValue, msg)
	case strings.Contains(msg, "incompatible API version"):
		return fmt.Sprintf("the plugin speaks another protocol version than kds-host (%d): %s", shared.ProtocolVersion, msg)
	case strings.Contains(msg, "unsupported plugin protocol"):
		return "the plugin serves net/rpc; kds-host plugins serve gRPC (shared.Serve* does): " + msg
	case errors.Is(err, launch.ErrNotAPlugin):
		return msg + ". Serve the plugin with shared.ServeRetryForcer, shared.ServeOwnerCheck or shared.Serve: they answer the handshake."
	}
	return "the plugin could not be started: " + msg
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// servedKinds lists the kinds the plugin serves, from gRPC reflection (go-plugin registers it),
// or, when the plugin has no reflection, by asking each kind's Describe.
func (c *checkRun) servedKinds(rpc plugin.ClientProtocol) []string {
	services := map[string]string{
		pluginv1.RetryForcer_ServiceDesc.ServiceName: KindRetryForcer,
		pluginv1.OwnerCheck_ServiceDesc.ServiceName:  KindOwnerCheck,
	}
	var kinds []string
	if gc, ok := rpc.(*plugin.GRPCClient); ok {
		if names, err := listServices(c.ctx, gc.Conn, c.opts.CallTimeout); err == nil {
			for _, n := range names {
				if k, ok := services[n]; ok {
					kinds = append(kinds, k)
				}
			}
			slices.SortFunc(kinds, func(a, b string) int { return -strings.Compare(a, b) }) // RetryForcer first
			return kinds
		}
	}
	probe := func(k string, d func(ctx context.Context) (*pluginv1.DescribeResponse, error)) {
		if _, err := call(c, k+".Describe", d); status.Code(err) != codes.Unimplemented {
			kinds = append(kinds, k)
		}
	}
	probe(KindRetryForcer, dispense[shared.RetryForcer](c, rpc, shared.RetryForcerName).Describe)
	probe(KindOwnerCheck, dispense[shared.OwnerCheck](c, rpc, shared.OwnerCheckName).Describe)
	return kinds
}

// listServices asks a gRPC server's reflection service for its services.
func listServices(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		return nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	_ = stream.CloseSend()
	list := resp.GetListServicesResponse()
	if list == nil {
		return nil, errors.New("no service list in the reflection response")
	}
	var names []string
	for _, s := range list.GetService() {
		names = append(names, s.GetName())
	}
	return names, nil
}

var versionNegotiationCheck = check{
	name:    CheckVersionNegotiation,
	summary: "a host that offers only protocol 2 is refused with go-plugin's version error",
	run: func(c *checkRun) {
		next := shared.ProtocolVersion + 1
		p, _, err := c.start(c.ctx, map[int]plugin.PluginSet{next: shared.ClientPluginSets()[shared.ProtocolVersion]})
		if err == nil {
			_ = p.Kill()
			c.failf("the plugin accepted protocol version %d, which kds-host does not define: serve only VersionedPlugins {%d: ...} (shared.Serve* does)",
				next, shared.ProtocolVersion)
		}
		c.g.Expect(err.Error()).To(gomega.ContainSubstring("incompatible API version"),
			"a host offering only protocol %d must be refused by version negotiation, not otherwise", next)
		c.notef("refused: %s", firstLine(err.Error()))
	},
}

var describeCheck = check{
	name:    CheckDescribe,
	summary: "Describe gives name and version; a RetryForcer also max_delay and sample_config",
	run: func(c *checkRun) {
		if c.rf != nil {
			d, err := call(c, "RetryForcer.Describe", c.rf.Describe)
			if err != nil {
				c.callFailed("RetryForcer.Describe", err)
			}
			c.rfDesc = d
			c.config = []byte(d.GetSampleConfig())
			if d.GetMaxDelay() != nil && d.GetMaxDelay().CheckValid() == nil {
				c.maxDelay = d.GetMaxDelay().AsDuration()
			}
			c.g.Expect(d.GetName()).NotTo(gomega.BeEmpty(), "RetryForcer.Describe: name must be set")
			c.g.Expect(d.GetVersion()).NotTo(gomega.BeEmpty(), "RetryForcer.Describe: version must be set")
			c.g.Expect(d.GetMaxDelay()).NotTo(gomega.BeNil(), "RetryForcer.Describe: max_delay must be set: it is the largest delay Schedule returns, and the host holds schedules to it")
			c.g.Expect(d.GetMaxDelay().CheckValid()).To(gomega.Succeed(), "RetryForcer.Describe: max_delay must be a valid duration")
			c.g.Expect(dur(d.GetMaxDelay().AsDuration())).To(gomega.BeNumerically(">", dur(0)), "RetryForcer.Describe: max_delay must be positive")
			c.g.Expect(d.GetSampleConfig()).NotTo(gomega.BeEmpty(), "RetryForcer.Describe: sample_config must be set: a policy document the plugin accepts, which shows its users what to write")
			c.notef("RetryForcer %s %s: max_delay %s, capabilities [%s]", d.GetName(), d.GetVersion(),
				d.GetMaxDelay().AsDuration(), strings.Join(d.GetCapabilities(), ", "))
		}
		if c.oc != nil {
			d, err := call(c, "OwnerCheck.Describe", c.oc.Describe)
			if err != nil {
				c.callFailed("OwnerCheck.Describe", err)
			}
			c.ocDesc = d
			c.g.Expect(d.GetName()).NotTo(gomega.BeEmpty(), "OwnerCheck.Describe: name must be set")
			c.g.Expect(d.GetVersion()).NotTo(gomega.BeEmpty(), "OwnerCheck.Describe: version must be set")
			c.notef("OwnerCheck %s %s: capabilities [%s]", d.GetName(), d.GetVersion(), strings.Join(d.GetCapabilities(), ", "))
		}
	},
}

var killCheck = check{
	name:    CheckKill,
	summary: fmt.Sprintf("after Kill the process exits within %s and leaves no process behind", MaxExitAfterKill),
	always:  true,
	run: func(c *checkRun) {
		if c.proc == nil {
			c.notRunf("no plugin process was started (see %s)", CheckHandshake)
		}
		if c.handshakeFailed {
			c.notRunf("the handshake failed (see %s); the suite has killed the process. A clean exit is checked once the host can talk to the plugin", CheckHandshake)
		}
		pid := c.proc.Pid()
		if c.proc.Exited() || exited(pid) {
			if c.broken != "" {
				c.notRunf("%s", c.broken)
			}
			c.notRunf("the plugin process had exited before it was killed")
		}
		kids, kidsErr := descendants(pid)
		for _, p := range groupMembers(pid) {
			if !slices.Contains(kids, p) {
				kids = append(kids, p)
			}
		}
		start := time.Now()
		killErr := c.proc.Kill() // as the host kills: bounded by killTimeout, then SIGKILL of the group
		elapsed := time.Since(start)
		c.killed = true
		if errors.Is(killErr, launch.ErrKillTimeout) {
			killAll(append(kids, pid))
			c.failf("Kill did not return within %s (%v); the suite has killed processes %v. go-plugin waits for the plugin's stdout and stderr to close: a process the plugin started that keeps them open keeps the host waiting.",
				killTimeout, killErr, append(kids, pid))
		}

		// Children killed with their parent may take a moment to go.
		var left []int
		for deadline := start.Add(MaxExitAfterKill); ; {
			left = running(kids)
			if len(left) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		killAll(left)

		if errors.Is(killErr, launch.ErrForcedKill) {
			c.failf("the plugin did not exit when asked: go-plugin asked it to shut down, waited %s and had to SIGKILL it (Kill took %s). A plugin's main must return when shared.Serve returns, and nothing may hold it up.",
				MaxExitAfterKill, round(elapsed))
		}
		c.g.Expect(dur(elapsed)).To(gomega.BeNumerically("<=", dur(MaxExitAfterKill)), "Kill took too long")
		if !exited(pid) {
			c.failf("process %d still runs after Kill returned", pid)
		}
		if len(left) > 0 {
			c.failf("processes the plugin started, %v, still run %s after Kill (the suite has now killed them): a plugin must stop what it starts when Serve returns, or start it with Pdeathsig",
				left, MaxExitAfterKill)
		}
		switch {
		case kidsErr != nil:
			c.notef("exited %s after Kill; child processes not checked: %v", round(elapsed), kidsErr)
		case len(kids) > 0:
			c.notef("exited %s after Kill; its %d child processes are gone too", round(elapsed), len(kids))
		default:
			c.notef("exited %s after Kill", round(elapsed))
		}
	},
}

// dur is a time.Duration that gomega prints as 1.5s rather than 1500000000.
type dur time.Duration

func (d dur) GomegaString() string { return time.Duration(d).String() }
