package pgtest

import (
	"os"
	"syscall"
)

// sysProcAttr runs a child as cred (when not nil) and kills it when the test binary dies.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
}

// tempBase is where a server's directory goes: /dev/shm when it is a tmpfs with room to spare
// (creating a database there takes a tenth of the time it takes on a disk), else the usual
// temporary directory.
func tempBase() string {
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err == nil && uint64(st.Bavail)*uint64(st.Bsize) >= 1<<30 {
		if f, err := os.CreateTemp("/dev/shm", "kds-pgtest-probe-"); err == nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
			return "/dev/shm"
		}
	}
	return os.TempDir()
}
