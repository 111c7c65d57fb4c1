// Command owner-check is kds-host's reference OwnerCheck plugin: a mesh-scoped resource waits
// for its Mesh, an explicit owner reference waits for its owner, and an owner that exists nowhere
// is a rejection. The host starts it; run by hand it only says so.
package main

import (
	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	"github.com/kds-host/kds-host/shared"
)

func main() { shared.ServeOwnerCheck(ownerpredict.New()) }
