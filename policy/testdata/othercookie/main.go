// Command othercookie is a test fixture: a go-plugin plugin made for another program, with
// another magic cookie. It serves the reference RetryForcer, so only the cookie is wrong.
package main

import (
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
	"github.com/kds-host/kds-host/shared"
)

func main() {
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: goplugin.HandshakeConfig{
			ProtocolVersion:  shared.ProtocolVersion,
			MagicCookieKey:   "ANOTHER_PROGRAM_PLUGIN",
			MagicCookieValue: "another-program",
		},
		VersionedPlugins: shared.PluginSets(retrypolicy.New(), nil),
		GRPCServer:       goplugin.DefaultGRPCServer,
	})
}
