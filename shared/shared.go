// Package shared is what the kds-host control plane and its plugins both use: the Go interfaces
// of the two plugin kinds, the go-plugin handshake and plugin set, the gRPC adapters in both
// directions, and the Serve helpers that make a plugin's main three lines.
package shared

import (
	"os/exec"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
)

// Plugin names in the plugin set. A binary serves one or both; the host learns which from what
// it answers.
const (
	RetryForcerName = "retry_forcer"
	OwnerCheckName  = "owner_check"
)

// ProtocolVersion is the first (and current) version of the kds-host plugin protocol.
const ProtocolVersion = 1

// Handshake is shared by the host and every plugin. The cookie is not a security measure: it
// keeps a person who runs a plugin binary by hand from starting it by mistake, and it keeps the
// host from talking to a go-plugin binary made for another program.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "KDS_HOST_PLUGIN",
	MagicCookieValue: "6f1d8c0e-kds-host-plugin-protocol",
}

// PluginSets returns the versioned plugin set with the given implementations; a nil
// implementation is left out, so a server serves only what it has and a client may ask for both.
func PluginSets(rf RetryForcer, oc OwnerCheck) map[int]plugin.PluginSet {
	set := plugin.PluginSet{}
	if rf != nil {
		set[RetryForcerName] = &RetryForcerPlugin{Impl: rf}
	}
	if oc != nil {
		set[OwnerCheckName] = &OwnerCheckPlugin{Impl: oc}
	}
	return map[int]plugin.PluginSet{ProtocolVersion: set}
}

// ClientPluginSets is the plugin set a host hands to a client: both kinds, no implementation.
func ClientPluginSets() map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{ProtocolVersion: {
		RetryForcerName: &RetryForcerPlugin{},
		OwnerCheckName:  &OwnerCheckPlugin{},
	}}
}

// ClientConfig is the go-plugin client configuration for a kds-host plugin binary: gRPC only,
// the kds-host handshake, AutoMTLS on. Callers add SecureConfig, StartTimeout and the like.
func ClientConfig(cmd *exec.Cmd, logger hclog.Logger) *plugin.ClientConfig {
	return &plugin.ClientConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: ClientPluginSets(),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		Logger:           logger,
	}
}
