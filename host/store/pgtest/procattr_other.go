//go:build unix && !linux

package pgtest

import (
	"os"
	"syscall"
)

// sysProcAttr runs a child as cred (when not nil).
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}

func tempBase() string { return os.TempDir() }
