// Command both is a test fixture: one plugin binary serving both kinds, the reference
// RetryForcer and OwnerCheck.
package main

import (
	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
	"github.com/kds-host/kds-host/shared"
)

func main() { shared.Serve(retrypolicy.New(), ownerpredict.New()) }
