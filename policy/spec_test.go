package policy_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
	"github.com/kds-host/kds-host/policy"
)

var hex64 = strings.Repeat("0123456789abcdef", 4)

func TestParseSpec(t *testing.T) {
	for _, tc := range []struct {
		in      string
		path    string
		pinned  bool
		folder  bool
		wantErr string
	}{
		{in: "./my-plugin/plugin.py@sha256-folder:" + hex64, path: "./my-plugin/plugin.py", pinned: true, folder: true},
		{in: "./a@sha256:b/plugin.py@sha256-folder:" + hex64, path: "./a@sha256:b/plugin.py", pinned: true, folder: true},
		{in: "./a@sha256-folder:b/x@sha256:" + hex64, path: "./a@sha256-folder:b/x", pinned: true},
		{in: "./x@sha256-folder:abc", wantErr: "the checksum must be 64 hex digits (kds-host plugin checksum --folder PATH)"},
		{in: "./bin/retry-forcer", path: "./bin/retry-forcer"},
		{in: "builtin", path: "builtin"},
		{in: "./bin/retry-forcer@sha256:" + hex64, path: "./bin/retry-forcer", pinned: true},
		{in: "/opt/a@b/forcer@sha256:" + hex64, path: "/opt/a@b/forcer", pinned: true},
		{in: "./bin/x@sha256:abc", wantErr: `plugin "./bin/x@sha256:abc": the checksum must be 64 hex digits (sha256sum PATH), got "abc"`},
		{in: "./bin/x@sha256:" + strings.Repeat("zz", 32), wantErr: "the checksum must be 64 hex digits"},
		{in: "builtin@sha256:" + hex64, wantErr: "the built-in plugins take no checksum"},
		{in: "@sha256:" + hex64, wantErr: "no path (want PATH, PATH@sha256:HEX or PATH@sha256-folder:HEX)"},
		{in: "", wantErr: "no path"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			g := NewWithT(t)
			s, err := policy.ParseSpec(tc.in)
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(s.Path).To(Equal(tc.path))
			g.Expect(s.SHA256 != nil).To(Equal(tc.pinned))
			g.Expect(s.PinFolder).To(Equal(tc.folder))
			g.Expect(s.String()).To(Equal(tc.in))
		})
	}
}

func TestReadDocumentFlag(t *testing.T) {
	g := NewWithT(t)
	file := filepath.Join(t.TempDir(), "fixed.yaml")
	g.Expect(os.WriteFile(file, []byte("policy: fixed\n"), 0o600)).To(Succeed())

	name, d, err := policy.ReadDocumentFlag("retry-forcer=" + file)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(name).To(Equal("retry-forcer"))
	g.Expect(d).To(Equal(policy.Document{Source: file, Data: []byte("policy: fixed\n")}))

	for _, bad := range []string{"retry-forcer", "=" + file, "retry-forcer="} {
		_, _, err = policy.ReadDocumentFlag(bad)
		g.Expect(err).To(MatchError(ContainSubstring("want NAME=FILE")), bad)
	}
	_, _, err = policy.ReadDocumentFlag("retry-forcer=/no/such/file")
	g.Expect(err).To(MatchError(ContainSubstring("no such file")))
}

func TestLoadFile(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		g.Expect(os.WriteFile(p, []byte(text), 0o600)).To(Succeed())
		return p
	}
	write("policy.yaml", "policy: decorrelated\n")
	file := write("kds-host.yaml", `
plugins:
  - path: ./bin/retry-forcer@sha256:`+hex64+`
    config: {policy: fixed, delay: 1s}
  - path: /opt/owner-check
    sha256: `+hex64+`
    env: [AWS_REGION, OWNER_CHECK_MODE]
  - path: ./bin/other
    configFile: policy.yaml
  - path: builtin
    config: |
      policy: fixed
      delay: 3s
`)
	p, err := policy.LoadFile(file)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.List).To(HaveLen(4))
	g.Expect(p.List[0].Path).To(Equal(filepath.Join(dir, "bin/retry-forcer")), "relative to the file's folder")
	g.Expect(p.List[0].SHA256).To(HaveLen(32))
	cfg, err := retrypolicy.Parse(p.List[0].Document.Data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg).To(Equal(retrypolicy.Config{Policy: "fixed", Delay: 1e9}))
	g.Expect(p.List[0].Document.Source).To(Equal(file + " (inline, plugins[0])"))
	g.Expect(p.List[1].Path).To(Equal("/opt/owner-check"))
	g.Expect(p.List[1].SHA256).To(HaveLen(32))
	g.Expect(p.List[1].Document).To(BeNil())
	g.Expect(p.List[1].Env).To(Equal([]string{"AWS_REGION", "OWNER_CHECK_MODE"}))
	g.Expect(p.List[0].Env).To(BeNil())
	g.Expect(p.List[2].Document.Source).To(Equal(filepath.Join(dir, "policy.yaml")))
	g.Expect(string(p.List[2].Document.Data)).To(Equal("policy: decorrelated\n"))
	g.Expect(p.List[3].Path).To(Equal(policy.Builtin))
	g.Expect(string(p.List[3].Document.Data)).To(Equal("policy: fixed\ndelay: 3s\n"))

	empty, err := policy.LoadFile(write("empty.yaml", "# nothing\n"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(empty.List).To(BeEmpty())

	// A file in the working folder: a bare name stays a path, not a $PATH lookup.
	t.Chdir(dir)
	local, err := policy.LoadFile("local.yaml")
	g.Expect(err).To(MatchError(ContainSubstring("no such file")))
	write("local.yaml", "plugins:\n  - path: retry-forcer\n    configFile: policy.yaml\n")
	local, err = policy.LoadFile("local.yaml")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(local.List[0].Path).To(Equal("./retry-forcer"))
	g.Expect(local.List[0].Document.Source).To(Equal("./policy.yaml"))

	sample, err := policy.LoadFile(write("sample.yaml", policy.SampleConfigFile))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sample.List).To(HaveLen(2))

	for _, tc := range []struct{ text, wantErr string }{
		{"plugins:\n  - path: x\n    conf: {}\n", "field conf not found"},
		{"plugins:\n  - config: {}\n", "plugins[0]: path is required"},
		{"plugins:\n  - path: x\n    config: {}\n    configFile: y\n", "plugins[0]: give config or configFile, not both"},
		{"plugins:\n  - path: x@sha256:" + hex64 + "\n    sha256: " + hex64 + "\n", "the checksum is given twice"},
		{"plugins:\n  - path: x\n    configFile: missing.yaml\n", "plugins[0]: configFile: open"},
		{"plugins: [", "yaml"},
		{"plugins:\n  - path: x\n    env: [A=b]\n", `plugins[0]: env: environment variable "A=b": give a name alone`},
		{"plugins:\n  - path: builtin\n    env: [A]\n", "plugins[0]: env: the built-in plugins run in the host's process"},
	} {
		_, err := policy.LoadFile(write("bad.yaml", tc.text))
		g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)), tc.text)
		g.Expect(err.Error()).To(HavePrefix("config " + filepath.Join(dir, "bad.yaml")))
	}
	_, err = policy.LoadFile(filepath.Join(dir, "none.yaml"))
	g.Expect(err).To(MatchError(ContainSubstring("no such file")))
}
