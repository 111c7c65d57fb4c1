package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/resource"
)

// defaultCP is the global's API address with the default ports.
const defaultCP = "http://127.0.0.1:5681"

// clientCommands are the commands that talk to a running control plane's API.
func clientCommands() []*cobra.Command {
	return []*cobra.Command{newApplyCmd(), newGetCmd(), newDeleteCmd(), newCheckCmd(), newPluginCmd(), newInspectCmd(), newTokenCmd(), newConfigCmd()}
}

// apiFlags are the flags of every command that talks to a control plane's API.
type apiFlags struct {
	cmd         *cobra.Command
	cp          string
	timeout     time.Duration
	tokenFile   string
	dataDir     string
	caFile      string
	configToken string // the current control plane's token, from the CLI's config
}

func addAPIFlags(cmd *cobra.Command) *apiFlags {
	f := &apiFlags{cmd: cmd}
	cmd.Flags().StringVar(&f.cp, "cp", defaultCP, "the control plane's API address (a zone's is http://127.0.0.1:15681; default: the current one of `kds-host config control-planes`, else "+defaultCP+")")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 10*time.Second, "timeout of each request to the control plane")
	cmd.Flags().StringVar(&f.tokenFile, "token-file", "", "file holding the API token (default: $KDS_TOKEN, else the global's admin token under --data-dir)")
	cmd.Flags().StringVar(&f.dataDir, "data-dir", ".data/kds-host", "the global's data dir on this machine, where it keeps its admin token ("+auth.AdminTokenFile+")")
	cmd.Flags().StringVar(&f.caFile, "cp-ca", "", "CA file that signed the API's certificate, for an https:// --cp")
	return f
}

// token is the API token to send: --token-file, else $KDS_TOKEN, else the admin token of a global
// that runs on this machine with --data-dir, else none (a zone's API, a global without auth).
func (f *apiFlags) token() (string, error) {
	if f.tokenFile != "" {
		t, err := auth.ReadTokenFile(f.tokenFile)
		if err != nil {
			return "", fmt.Errorf("--token-file: %w", err)
		}
		return t, nil
	}
	if t := strings.TrimSpace(os.Getenv("KDS_TOKEN")); t != "" {
		return t, nil
	}
	if f.configToken != "" {
		return f.configToken, nil
	}
	if t, err := auth.ReadTokenFile(filepath.Join(f.dataDir, auth.AdminTokenFile)); err == nil {
		return t, nil
	}
	return "", nil
}

// apiSession is one command's connection to a control plane: its client and, once asked for,
// the kinds it serves.
type apiSession struct {
	flags  *apiFlags
	client *api.Client
	kinds  *resource.Registry
}

// checkAddress reports whether --cp is an http:// or https:// URL.
func (f *apiFlags) checkAddress() error {
	u, err := url.Parse(f.cp)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--cp %q: want an http:// or https:// URL, e.g. %s", f.cp, defaultCP)
	}
	return nil
}

// useCurrent takes the current control plane of the CLI's config when --cp was not given.
func (f *apiFlags) useCurrent() error {
	if f.cmd == nil || f.cmd.Flags().Changed("cp") {
		return nil
	}
	c, _, err := loadCLIConfig()
	if err != nil {
		return err
	}
	cp, ok := c.current()
	if !ok {
		return nil
	}
	f.cp = cp.Address
	if f.caFile == "" {
		f.caFile = cp.CAFile
	}
	if f.tokenFile == "" && os.Getenv("KDS_TOKEN") == "" {
		if cp.TokenFile != "" {
			f.tokenFile = cp.TokenFile
		} else if cp.Token != "" {
			f.configToken = cp.Token
		}
	}
	return nil
}

func (f *apiFlags) session() (*apiSession, error) {
	if err := f.useCurrent(); err != nil {
		return nil, err
	}
	if err := f.checkAddress(); err != nil {
		return nil, err
	}
	if f.timeout <= 0 {
		return nil, fmt.Errorf("--timeout %s: must be positive", f.timeout)
	}
	tok, err := f.token()
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: f.timeout}
	if f.caFile != "" {
		pool, err := readCAs(f.caFile)
		if err != nil {
			return nil, fmt.Errorf("--cp-ca: %w", err)
		}
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	}
	return &apiSession{
		flags:  f,
		client: &api.Client{BaseURL: f.cp, HTTPClient: hc, Token: tok},
	}, nil
}

// explain turns a request that got no answer into an error that says what to check. Every client
// command passes its error through it.
func (s *apiSession) explain(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("cannot reach control plane at %s: %v (is it running? set --cp or KDS_CP)", s.flags.cp, ue.Err)
	}
	var ae *api.Error
	if errors.As(err, &ae) && (ae.Status == http.StatusNotFound || ae.Status == http.StatusMethodNotAllowed) && s.isZone() {
		return fmt.Errorf("%w (%s is a zone control plane's API, which serves what the zone holds, read-only; for this, use the global's: --cp %s)", err, s.flags.cp, defaultCP)
	}
	return err
}

// isZone reports whether the API is a zone control plane's (GET / says so).
func (s *apiSession) isZone() bool {
	ctx, cancel := context.WithTimeout(context.Background(), s.flags.timeout)
	defer cancel()
	i, err := s.client.Index(ctx)
	return err == nil && i.Mode == "zone"
}

// kind resolves a kind as typed on a command line: singular or plural, any case.
func (s *apiSession) kind(ctx context.Context, name string) (resource.Kind, error) {
	reg, err := s.registry(ctx)
	if err != nil {
		return resource.Kind{}, err
	}
	k, ok := reg.Lookup(name)
	if !ok {
		return resource.Kind{}, fmt.Errorf("unknown kind %q%s (known: %s)", name, didYouMean(name, reg), knownKinds(reg))
	}
	return k, nil
}

// registry returns the kinds the control plane serves, asking it once.
func (s *apiSession) registry(ctx context.Context) (*resource.Registry, error) {
	if s.kinds == nil {
		reg, err := s.client.Kinds(ctx)
		if err != nil {
			return nil, fmt.Errorf("list the kinds of %s: %w", s.flags.cp, err)
		}
		s.kinds = reg
	}
	return s.kinds, nil
}

// didYouMean suggests the kind closest to what was typed, when one is close: ", did you mean
// \"meshtimeouts\"?".
func didYouMean(typed string, reg *resource.Registry) string {
	best, bestD := "", 3 // at most 2 edits away
	t := strings.ToLower(typed)
	for _, k := range reg.Kinds() {
		for _, cand := range []string{strings.ToLower(k.Name), k.Plural} {
			if d := editDistance(t, cand); d < bestD {
				best, bestD = cand, d
			}
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(", did you mean %q?", best)
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// knownKinds lists a registry's kinds with their plurals, for error messages.
func knownKinds(reg *resource.Registry) string {
	var out []string
	for _, k := range reg.Kinds() {
		out = append(out, fmt.Sprintf("%s (%s)", k.Name, k.Plural))
	}
	return strings.Join(out, ", ")
}

// display is how the CLI names a resource in what it prints: `meshtimeout "x"`.
func display(k resource.Kind, name string) string {
	return fmt.Sprintf("%s %q", strings.ToLower(k.Name), name)
}
