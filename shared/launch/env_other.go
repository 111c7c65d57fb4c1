//go:build !windows

package launch

// baseEnv names the host environment variables every plugin sees: where programs are, the
// user's home, the temporary folder.
func baseEnv() []string { return []string{"PATH", "HOME", "TMPDIR"} }
