package launch

// baseEnv names the host environment variables every plugin sees: where programs are, the
// user's profile, the temporary folder, and SYSTEMROOT, without which Windows programs cannot
// load the system's libraries (Go's networking and crypto among them).
func baseEnv() []string { return []string{"PATH", "SYSTEMROOT", "USERPROFILE", "TEMP", "TMP"} }
