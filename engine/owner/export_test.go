package owner

import (
	"strings"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/host/kds"
)

// kdsMapping is kds-host's Mapping (host/controlplane passes the same): the tests speak of
// kds-host's resources, mesh-scoped and owned.
var kdsMapping = Mapping{Candidate: kds.ResourceOf, Owners: kds.OwnersOf, WireKey: kds.WireKeyOf, RefOf: kds.RefOfWireKey}

// KDSMapping is kdsMapping, for the package's outside tests.
var KDSMapping = kdsMapping

// ref is a kds-host key's Ref.
var ref = kds.RefOf

// refOf is the Ref of a key written as resource.Key.String writes it: "Kind/name" or
// "Kind/mesh/name".
func refOf(key string) engine.Ref {
	kind, name, _ := strings.Cut(key, "/")
	return engine.Ref{TypeURL: kind, Name: name}
}

// ownersOf is what e waits for, as kds-host says (nil: no entry).
func ownersOf(e *engine.Entry) []engine.Ref {
	if e == nil {
		return nil
	}
	return kdsMapping.owners(e)
}
