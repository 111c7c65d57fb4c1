// Command wrong-cookie is a broken RetryForcer fixture: a correct plugin served with another
// program's magic cookie, so it refuses to start under kds-host.
package main

import (
	"github.com/hashicorp/go-plugin"

	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/conformance/testdata/fixture"
)

func main() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: plugin.HandshakeConfig{
			ProtocolVersion:  shared.ProtocolVersion,
			MagicCookieKey:   "BASIC_PLUGIN",
			MagicCookieValue: "hello",
		},
		VersionedPlugins: shared.PluginSets(fixture.New("wrong-cookie"), nil),
		GRPCServer:       plugin.DefaultGRPCServer,
	})
}
