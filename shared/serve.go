package shared

import (
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
)

// ServeRetryForcer serves impl as a kds-host RetryForcer plugin and returns when the host is
// done with it. A plugin's main is:
//
//	func main() { shared.ServeRetryForcer(mypolicy.New()) }
func ServeRetryForcer(impl RetryForcer) { serve(impl, nil) }

// ServeOwnerCheck serves impl as a kds-host OwnerCheck plugin.
func ServeOwnerCheck(impl OwnerCheck) { serve(nil, impl) }

// Serve serves both kinds from one binary; either may be nil.
func Serve(rf RetryForcer, oc OwnerCheck) { serve(rf, oc) }

func serve(rf RetryForcer, oc OwnerCheck) {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: PluginSets(rf, oc),
		GRPCServer:       plugin.DefaultGRPCServer,
		// JSON lines on stderr: the host's go-plugin client parses them into its own hclog
		// logger, under the plugin's name, at the right level.
		Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, JSONFormat: true}),
	})
}
