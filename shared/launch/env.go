package launch

import (
	"fmt"
	"os"
	"slices"
	"strings"
)

// pluginEnv is the environment a plugin starts with: the host's values of the names every
// plugin gets (baseEnv) and of the names in allow, those the host has set, and nothing else of
// the host's environment. go-plugin adds its own variables after these (its cookie, PLUGIN_*,
// the AutoMTLS certificate), and on a name given twice the later value wins.
func pluginEnv(allow []string) ([]string, error) {
	if err := CheckEnv(allow); err != nil {
		return nil, err
	}
	names := baseEnv()
	for _, n := range allow {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	env := []string{} // not nil: exec.Cmd takes a nil Env for the host's whole environment
	for _, n := range names {
		if v, ok := os.LookupEnv(n); ok {
			env = append(env, n+"="+v)
		}
	}
	return env, nil
}

// CheckEnv checks names of environment variables a plugin may see (Options.Env): each is a
// name alone, the host's value is what the plugin gets.
func CheckEnv(names []string) error {
	for _, n := range names {
		switch {
		case n == "":
			return fmt.Errorf("an empty environment variable name")
		case strings.Contains(n, "="):
			return fmt.Errorf("environment variable %q: give a name alone; the plugin gets the host's value", n)
		case strings.ContainsRune(n, 0):
			return fmt.Errorf("environment variable %q: a name cannot hold a NUL byte", n)
		}
	}
	return nil
}
