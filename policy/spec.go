package policy

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kds-host/kds-host/shared/launch"
)

// Builtin is the Path of the in-process reference plugins (retrypolicy and ownerpredict).
const Builtin = "builtin"

// checksumSep separates a binary's path from its pinned checksum: PATH@sha256:HEX;
// folderChecksumSep from the pinned checksum of its folder: PATH@sha256-folder:HEX.
const (
	checksumSep       = "@sha256:"
	folderChecksumSep = "@sha256-folder:"
)

// Plugins is what runs: the plugin binaries and the policy documents they are configured with.
// kds-host's --plugin, --plugin-config and --config all describe one. The zero value runs the
// built-in plugins only.
type Plugins struct {
	// List holds the binaries to run, and Builtin at most once (to give the built-in retry
	// policy a document). A binary serves RetryForcer, OwnerCheck or both: the runtime asks it.
	List []Spec
	// Documents are policy documents by plugin name, for the plugins whose Spec carries none:
	// a binary's name in Describe ("retry-forcer"), its file's base name, or "builtin".
	Documents map[string]Document
}

// Spec is one plugin of a Plugins list.
type Spec struct {
	// Path is the plugin binary, or Builtin.
	Path string
	// SHA256 pins the binary's checksum: the binary is copied to a private folder, hashed as
	// it is copied, refused if it does not match, and run from the copy, so the process runs
	// exactly the bytes that were hashed. Nil runs whatever is at Path.
	SHA256 []byte
	// PinFolder makes SHA256 the checksum of Path's folder (launch.FolderChecksum): the whole
	// folder is copied and hashed, so a script runs with exactly the files beside it that were
	// hashed (PATH@sha256-folder:HEX).
	PinFolder bool
	// Env names host environment variables this plugin sees besides Options.Env's (a --config
	// file's env: [NAME, ...]).
	Env []string
	// Document is the policy document the plugin's RetryForcer is configured with; nil looks
	// it up in Plugins.Documents, and without one there the plugin keeps its own default.
	Document *Document
}

// Document is a policy document and where it came from.
type Document struct {
	// Source names the document in messages: a file, or "FILE (inline)".
	Source string
	Data   []byte
}

// String is PATH, or PATH@sha256:HEX (PATH@sha256-folder:HEX) when the checksum is pinned.
func (s Spec) String() string {
	switch {
	case s.SHA256 == nil:
		return s.Path
	case s.PinFolder:
		return s.Path + folderChecksumSep + hex.EncodeToString(s.SHA256)
	}
	return s.Path + checksumSep + hex.EncodeToString(s.SHA256)
}

// ParseSpec reads a kds-host --plugin value: PATH, PATH@sha256:HEX, PATH@sha256-folder:HEX, or builtin.
func ParseSpec(v string) (Spec, error) {
	path, sum, pinned, folder := v, "", false, false
	if i := strings.LastIndex(v, checksumSep); i >= 0 {
		path, sum, pinned = v[:i], v[i+len(checksumSep):], true
	}
	if i := strings.LastIndex(v, folderChecksumSep); i >= 0 && (!pinned || i > len(path)) {
		path, sum, pinned, folder = v[:i], v[i+len(folderChecksumSep):], true, true
	}
	if path == "" {
		return Spec{}, fmt.Errorf("plugin %q: no path (want PATH, PATH@sha256:HEX or PATH@sha256-folder:HEX)", v)
	}
	s := Spec{Path: path, PinFolder: folder}
	if !pinned {
		return s, nil
	}
	if path == Builtin {
		return Spec{}, fmt.Errorf("plugin %q: the built-in plugins take no checksum", v)
	}
	b, err := hex.DecodeString(sum)
	if err != nil || len(b) != 32 {
		how := "sha256sum PATH"
		if folder {
			how = "kds-host plugin checksum --folder PATH"
		}
		return Spec{}, fmt.Errorf("plugin %q: the checksum must be 64 hex digits (%s), got %q", v, how, sum)
	}
	s.SHA256 = b
	return s, nil
}

// ReadDocumentFlag reads a kds-host --plugin-config value, NAME=FILE, and the file it names.
func ReadDocumentFlag(v string) (name string, doc Document, err error) {
	name, file, ok := strings.Cut(v, "=")
	if !ok || name == "" || file == "" {
		return "", Document{}, fmt.Errorf("plugin config %q: want NAME=FILE, e.g. retry-forcer=./policy.yaml", v)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", Document{}, fmt.Errorf("plugin config %q: %w", v, err)
	}
	return name, Document{Source: file, Data: data}, nil
}

// fileConfig is the shape of a kds-host --config file.
type fileConfig struct {
	Plugins []fileSpec `yaml:"plugins"`
}

type fileSpec struct {
	Path       string    `yaml:"path"`
	SHA256     string    `yaml:"sha256"`
	Env        []string  `yaml:"env"`
	Config     yaml.Node `yaml:"config"`
	ConfigFile string    `yaml:"configFile"`
}

// SampleConfigFile is a kds-host --config file with every field it accepts.
const SampleConfigFile = `# kds-host plugin configuration (--config FILE; SIGHUP or POST /api/plugins/reload re-reads it).
# Relative paths are relative to this file's folder.
plugins:
  - path: ./bin/retry-forcer            # or ./bin/retry-forcer@sha256:<hex>; a script and the files
                                        # beside it: ./my-plugin/plugin.py@sha256-folder:<hex>
    # sha256: <hex>                     # the same pin, as a field
    config: {policy: fixed, delay: 1s}  # inline policy document...
    # configFile: ./policy.yaml         # ...or one from a file
    # env: [AWS_REGION]                 # host environment variables it sees, besides PATH,
                                        # HOME, TMPDIR and --plugin-env's; nothing else
  - path: builtin                       # the in-process policies; config applies to its retry policy
`

// LoadFile reads a kds-host --config file: the plugins to run and their policy documents. Relative paths
// in it are relative to the file's folder.
func LoadFile(file string) (Plugins, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return Plugins{}, fmt.Errorf("config %s: %w", file, err)
	}
	var fc fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	// An empty file (io.EOF) runs the built-in plugins.
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
		return Plugins{}, fmt.Errorf("config %s: %w", file, err)
	}
	dir := filepath.Dir(file)
	var out Plugins
	for i, fs := range fc.Plugins {
		at := fmt.Sprintf("config %s: plugins[%d]", file, i)
		if fs.Path == "" {
			return Plugins{}, fmt.Errorf("%s: path is required (a plugin binary, or builtin)", at)
		}
		s, err := ParseSpec(fs.Path)
		if err != nil {
			return Plugins{}, fmt.Errorf("%s: %w", at, err)
		}
		if fs.SHA256 != "" {
			if s.SHA256 != nil {
				return Plugins{}, fmt.Errorf("%s: the checksum is given twice (in path and in sha256)", at)
			}
			if s, err = ParseSpec(fs.Path + checksumSep + fs.SHA256); err != nil {
				return Plugins{}, fmt.Errorf("%s: %w", at, err)
			}
		}
		if s.Path != Builtin {
			s.Path = nextTo(dir, s.Path)
		}
		if len(fs.Env) > 0 {
			if s.Path == Builtin {
				return Plugins{}, fmt.Errorf("%s: env: the built-in plugins run in the host's process", at)
			}
			if err := launch.CheckEnv(fs.Env); err != nil {
				return Plugins{}, fmt.Errorf("%s: env: %w", at, err)
			}
			s.Env = fs.Env
		}
		switch {
		case !fs.Config.IsZero() && fs.ConfigFile != "":
			return Plugins{}, fmt.Errorf("%s: give config or configFile, not both", at)
		case fs.ConfigFile != "":
			p := nextTo(dir, fs.ConfigFile)
			b, err := os.ReadFile(p)
			if err != nil {
				return Plugins{}, fmt.Errorf("%s: configFile: %w", at, err)
			}
			s.Document = &Document{Source: p, Data: b}
		case !fs.Config.IsZero():
			b, err := nodeDocument(&fs.Config)
			if err != nil {
				return Plugins{}, fmt.Errorf("%s: config: %w", at, err)
			}
			s.Document = &Document{Source: fmt.Sprintf("%s (inline, plugins[%d])", file, i), Data: b}
		}
		out.List = append(out.List, s)
	}
	return out, nil
}

// nextTo resolves a path given in a file in dir: relative to dir. A bare file name gets a "./",
// so that exec runs that file rather than looking the name up in $PATH.
func nextTo(dir, path string) string {
	if filepath.IsAbs(path) {
		return path
	}
	path = filepath.Join(dir, path)
	if !strings.ContainsRune(path, filepath.Separator) {
		path = "." + string(filepath.Separator) + path
	}
	return path
}

// nodeDocument turns an inline config into a policy document: a string is the document itself,
// anything else is written back as YAML.
func nodeDocument(n *yaml.Node) ([]byte, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		return []byte(n.Value), nil
	}
	return yaml.Marshal(n)
}
