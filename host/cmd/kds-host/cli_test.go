package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/store"
)

// newGlobalAPI serves a global's API over a SQLite store and returns its URL.
func newGlobalAPI(t *testing.T) string {
	t.Helper()
	st, err := store.Open(t.Context(), "", t.TempDir())
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ts := httptest.NewServer(api.New(api.Config{Store: st, Version: "test"}).Handler())
	t.Cleanup(ts.Close)
	return ts.URL
}

type cliResult struct {
	stdout, stderr string
	err            error
}

// runCLI runs kds-host with args, stdin as its standard input.
func runCLI(t *testing.T, stdin string, args ...string) cliResult {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetArgs(args)
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errOut)
	err := root.ExecuteContext(t.Context())
	return cliResult{stdout: out.String(), stderr: errOut.String(), err: err}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const multiDoc = `# a mesh and two policies
---
type: Mesh
name: default
---
---
# an empty document above, a comment-only one here
---
type: MeshTimeout
mesh: default
name: mt-1
spec:
  targetRef: {kind: Mesh}
  to:
    - targetRef: {kind: Mesh}
      default: {connectionTimeout: 3s}
--- {"type": "MeshRetry", "mesh": "default", "name": "retry-1", "spec": {"to": []}}
`

func TestApplyMultipleDocuments(t *testing.T) {
	g := NewWithT(t)
	cp := newGlobalAPI(t)
	file := writeFile(t, "resources.yaml", multiDoc)

	r := runCLI(t, "", "apply", "-f", file, "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(Equal("mesh \"default\" created\nmeshtimeout \"mt-1\" created\nmeshretry \"retry-1\" created\n"))

	r = runCLI(t, "", "apply", "-f", file, "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(Equal("mesh \"default\" unchanged\nmeshtimeout \"mt-1\" unchanged\nmeshretry \"retry-1\" unchanged\n"))

	r = runCLI(t, "", "apply", "-f", file, "--cp", cp, "-f", writeFile(t, "change.json",
		`{"type":"MeshRetry","mesh":"default","name":"retry-1","spec":{"to":[{"targetRef":{"kind":"Mesh"},"default":{"http":{"numRetries":2}}}]}}`))
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(HaveSuffix("meshretry \"retry-1\" configured\n"))

	// The mesh's 2 default MeshTimeouts and the one applied.
	r = runCLI(t, "", "get", "meshtimeouts", "-o", "json", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	var list api.List
	g.Expect(json.Unmarshal([]byte(r.stdout), &list)).To(Succeed())
	g.Expect(list.Total).To(Equal(3))
	g.Expect(list.Items).To(HaveLen(3))
	g.Expect(list.Items).To(ContainElement(HaveField("Name", "mt-1")))
	var raw map[string]any
	g.Expect(json.Unmarshal([]byte(r.stdout), &raw)).To(Succeed())
	g.Expect(raw).To(And(HaveKeyWithValue("total", BeEquivalentTo(3)), HaveKey("items"), HaveLen(2)))
}

func TestApplyReportsEveryRefusedDocument(t *testing.T) {
	g := NewWithT(t)
	cp := newGlobalAPI(t)
	file := writeFile(t, "mixed.yaml", `type: Mesh
name: default
---
type: MeshTimeout
mesh: default
name: bad
spec: {default: {connectionTimeout: abc}}
---
type: MeshTimeout
mesh: nope
name: orphan
spec: {default: {idleTimeout: 1s}}
---
type: MeshGizmo
name: g
---
type: MeshTimeout
mesh: default
name: good
spec: {default: {idleTimeout: 1s}}
---
spec: [unclosed
`)
	r := runCLI(t, "", "apply", "-f", file, "--cp", cp)
	g.Expect(r.err).To(MatchError("4 of 6 documents were not applied"))
	g.Expect(r.stdout).To(Equal("mesh \"default\" created\nmeshtimeout \"good\" created\n"))
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	g.Expect(lines).To(HaveLen(4))
	g.Expect(lines[0]).To(And(HavePrefix("error: "+file+":doc#2: MeshTimeout/default/bad: 400 Resource is not valid: "), ContainSubstring(`spec.default.connectionTimeout: "abc" is not a duration`)))
	g.Expect(lines[1]).To(And(HavePrefix("error: "+file+":doc#3: MeshTimeout/nope/orphan: 400 "), ContainSubstring(`mesh "nope" does not exist`)))
	g.Expect(lines[2]).To(And(HavePrefix("error: "+file+":doc#4: MeshGizmo/g: "), ContainSubstring(`unknown kind "MeshGizmo"`)))
	g.Expect(lines[3]).To(And(HavePrefix("error: "+file+":doc#6: "), ContainSubstring("not valid YAML or JSON")))

	r = runCLI(t, "", "get", "meshtimeout", "good", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred())
	r = runCLI(t, "", "get", "meshtimeout", "bad", "--cp", cp)
	g.Expect(r.err).To(MatchError(`Not found: MeshTimeout "bad" not found in mesh "default"`))
}

func TestApplyFromStdinAndRoundTrip(t *testing.T) {
	g := NewWithT(t)
	cp := newGlobalAPI(t)
	t.Setenv("KDS_CP", cp)

	r := runCLI(t, "type: Mesh\nname: default\n---\ntype: Mesh\nname: other\n", "apply", "-f", "-")
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(Equal("mesh \"default\" created\nmesh \"other\" created\n"))

	// What get prints, apply takes back: JSON lists and YAML lists alike.
	for _, format := range []string{"json", "yaml"} {
		got := runCLI(t, "", "get", "meshtimeouts", "-A", "-o", format)
		g.Expect(got.err).NotTo(HaveOccurred(), got.stderr)
		r = runCLI(t, got.stdout, "apply", "-f", "-")
		g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
		g.Expect(strings.Count(r.stdout, "unchanged")).To(Equal(4), r.stdout)
	}

	// A stream of JSON values, and a JSON array.
	r = runCLI(t, `{"type":"Mesh","name":"m1"}
{"type":"Mesh","name":"m2"}
---
[{"type":"Mesh","name":"m3"}, {"type":"Mesh","name":"m4"}]
`, "apply", "-f", "-")
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(Equal("mesh \"m1\" created\nmesh \"m2\" created\nmesh \"m3\" created\nmesh \"m4\" created\n"))

	r = runCLI(t, "{type: Mesh, name: m5} junk\n---\n42\n", "apply", "-f", "-")
	g.Expect(r.err).To(MatchError("2 of 2 documents were not applied"))
	g.Expect(r.stderr).To(ContainSubstring("error: stdin:doc#1: not valid YAML or JSON: content after the document"))
	g.Expect(r.stderr).To(ContainSubstring("error: stdin:doc#2: not a resource: want an object, got 42"))

	r = runCLI(t, "", "apply", "-f", "-")
	g.Expect(r.err).To(MatchError(ContainSubstring("no resources in")))
}

func TestGet(t *testing.T) {
	g := NewWithT(t)
	cp := newGlobalAPI(t)
	r := runCLI(t, multiDoc, "apply", "-f", "-", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)

	r = runCLI(t, "", "get", "meshes", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(MatchRegexp(`^NAME\s+GENERATION\s+AGE\ndefault\s+1\s+\d+s\n$`))

	for _, kind := range []string{"meshtimeouts", "MeshTimeout", "MESHTIMEOUT", "meshtimeout"} {
		r = runCLI(t, "", "get", kind, "-m", "default", "--cp", cp)
		g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		g.Expect(lines).To(HaveLen(4), kind)
		g.Expect(lines[0]).To(MatchRegexp(`^MESH\s+NAME\s+GENERATION\s+AGE$`))
		for i, name := range []string{"mesh-gateways-timeout-all-default", "mesh-timeout-all-default", "mt-1"} {
			g.Expect(lines[i+1]).To(MatchRegexp(`^default\s+`+name+`\s+1\s+\d+s$`), kind)
		}
	}

	r = runCLI(t, "", "get", "meshtimeout", "mt-1", "-o", "yaml", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(HavePrefix("type: MeshTimeout\nmesh: default\nname: mt-1\nspec:\n"))
	g.Expect(r.stdout).To(ContainSubstring("connectionTimeout: 3s"))
	g.Expect(r.stdout).To(ContainSubstring("generation: 1\ncreationTime: "), "the store's times follow the content")

	r = runCLI(t, "", "get", "meshtimeout", "mt-1", "-o", "json", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	var doc map[string]any
	g.Expect(json.Unmarshal([]byte(r.stdout), &doc)).To(Succeed())
	g.Expect(doc).To(And(HaveKey("creationTime"), HaveKey("modificationTime")))
	delete(doc, "creationTime")
	delete(doc, "modificationTime")
	withoutTimes, _ := json.Marshal(doc)
	g.Expect(string(withoutTimes)).To(MatchJSON(`{"type":"MeshTimeout","mesh":"default","name":"mt-1","generation":1,
		"spec":{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"3s"}}]}}`))

	r = runCLI(t, "", "get", "meshtimeouts", "-m", "other", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred())
	g.Expect(r.stdout).To(BeEmpty())
	g.Expect(r.stderr).To(Equal("No meshtimeouts found in mesh \"other\".\n"))

	r = runCLI(t, "", "get", "meshgizmos", "--cp", cp)
	g.Expect(r.err).To(MatchError(And(ContainSubstring(`unknown kind "meshgizmos"`), ContainSubstring("MeshTimeout (meshtimeouts)"))))

	r = runCLI(t, "", "get", "meshes", "-o", "xml", "--cp", cp)
	g.Expect(r.err).To(MatchError(`--output "xml": want table, wide, yaml or json`))
}

func TestDelete(t *testing.T) {
	g := NewWithT(t)
	cp := newGlobalAPI(t)
	r := runCLI(t, multiDoc, "apply", "-f", "-", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)

	r = runCLI(t, "", "delete", "meshtimeout", "mt-1", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(Equal("meshtimeout \"mt-1\" deleted\n"))
	r = runCLI(t, "", "delete", "meshtimeout", "mt-1", "--cp", cp)
	g.Expect(r.err).To(MatchError(`Not found: MeshTimeout "mt-1" not found in mesh "default"`))

	r = runCLI(t, "", "delete", "mesh", "default", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	r = runCLI(t, "", "get", "meshtimeouts", "-A", "-o", "json", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(MatchJSON(`{"items":[],"total":0}`))
}

func TestUnreachableControlPlane(t *testing.T) {
	g := NewWithT(t)
	ts := httptest.NewServer(nil)
	cp := ts.URL
	ts.Close()
	for _, args := range [][]string{
		{"get", "meshes", "--cp", cp},
		{"delete", "mesh", "default", "--cp", cp},
		{"apply", "-f", "-", "--cp", cp},
	} {
		r := runCLI(t, "type: Mesh\nname: default\n", args...)
		g.Expect(r.err).To(MatchError(And(
			HavePrefix("cannot reach control plane at "+cp+": "),
			ContainSubstring("connection refused"),
			HaveSuffix("(is it running? set --cp or KDS_CP)"),
		)), args[0])
	}

	r := runCLI(t, "", "get", "meshes", "--cp", "localhost:5681")
	g.Expect(r.err).To(MatchError(ContainSubstring("want an http:// or https:// URL")))
}

func TestZoneRefusesApply(t *testing.T) {
	g := NewWithT(t)
	st, err := store.Open(t.Context(), "", t.TempDir())
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = st.Close() })
	ts := httptest.NewServer(api.New(api.Config{Store: st, ReadOnly: true}).Handler())
	t.Cleanup(ts.Close)

	r := runCLI(t, "type: Mesh\nname: default\n", "apply", "-f", "-", "--cp", ts.URL)
	g.Expect(r.err).To(HaveOccurred())
	g.Expect(r.stderr).To(ContainSubstring("this is a zone control plane: resources are read-only here; apply them on the global"))
}

func TestGetShowsAgeAndWide(t *testing.T) {
	g := NewWithT(t)
	cp := newGlobalAPI(t)
	r := runCLI(t, "", "apply", "-f", writeFile(t, "m.yaml", "type: Mesh\nname: default\nlabels: {team: payments}\n"), "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	r = runCLI(t, "", "get", "meshes", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(MatchRegexp(`NAME\s+GENERATION\s+AGE\n`))
	g.Expect(r.stdout).To(MatchRegexp(`default\s+1\s+\d+s\n`))
	r = runCLI(t, "", "get", "meshes", "-o", "wide", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(MatchRegexp(`NAME\s+GENERATION\s+AGE\s+LABELS\s+OWNERS\s+MODIFIED\n`))
	g.Expect(r.stdout).To(MatchRegexp(`default\s+1\s+\d+s\s+team=payments\s+-\s+\d+s\n`))

	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for d, want := range map[time.Duration]string{5 * time.Second: "5s", 12 * time.Minute: "12m", 30 * time.Hour: "30h", 100 * time.Hour: "4d"} {
		g.Expect(age(now.Add(-d), now)).To(Equal(want))
	}
	g.Expect(age(time.Time{}, now)).To(Equal("-"))
}

// The CLI holds the API's limit of one resource (a PUT's body), names the document it refuses,
// and applies the others.
func TestApplyRefusesADocumentLargerThanAResource(t *testing.T) {
	g := NewWithT(t)
	cp := newGlobalAPI(t)
	file := writeFile(t, "big.yaml", "type: Mesh\nname: default\n---\ntype: Mesh\nname: big\nlabels: {pad: \""+strings.Repeat("a", api.MaxBodyBytes)+"\"}\n")
	r := runCLI(t, "", "apply", "-f", file, "--cp", cp)
	g.Expect(r.err).To(MatchError("1 of 2 documents were not applied"))
	g.Expect(r.stdout).To(Equal("mesh \"default\" created\n"))
	g.Expect(r.stderr).To(And(HavePrefix("error: "+file+":doc#2: "), ContainSubstring(fmt.Sprintf("one resource is at most %d bytes", api.MaxBodyBytes))))
}

// apply and check read a file under the API's bounds: a document whose YAML aliases would expand
// it past a body's limit, or that nests too deep, is refused by name before anything is built
// or sent, and the others are applied; a batch item the API refuses is printed with its status.
func TestApplyAndCheckRefuseADocumentThatExpandsOrNestsTooFar(t *testing.T) {
	g := NewWithT(t)
	cp := newGlobalAPI(t)
	bomb := "type: Mesh\nname: bomb\nspec:\n  item: &x \"" + strings.Repeat("a", 1<<20) + "\"\n  copies: [" + strings.TrimSuffix(strings.Repeat("*x, ", 200), ", ") + "]\n"
	deep := "type: Mesh\nname: deep\nspec: " + strings.Repeat("[", 120) + strings.Repeat("]", 120) + "\n"
	file := writeFile(t, "bomb.yaml", "type: Mesh\nname: default\n---\n"+bomb+"---\n"+deep)
	r := runCLI(t, "", "apply", "-f", file, "--cp", cp)
	g.Expect(r.err).To(MatchError("2 of 3 documents were not applied"))
	g.Expect(r.stdout).To(Equal("mesh \"default\" created\n"))
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	g.Expect(lines).To(HaveLen(2))
	g.Expect(lines[0]).To(And(HavePrefix("error: "+file+":doc#2: "), ContainSubstring("its YAML aliases expand it past the size limit")))
	g.Expect(lines[1]).To(And(HavePrefix("error: "+file+":doc#3: "), ContainSubstring("nests too deep")))

	r = runCLI(t, "", "check", "-f", file, "--cp", cp)
	g.Expect(r.err).To(MatchError(ContainSubstring(file + ":doc#2: ")))
	g.Expect(r.err).To(MatchError(ContainSubstring("its YAML aliases expand it past the size limit")))

	// A JSON file is read by the JSON decoder (bounded at its 10,000 levels) and sent: the API's
	// 400 for its depth is printed with its status.
	one := `{"type":"Mesh","name":"deep","spec":` + strings.Repeat(`{"a":`, api.MaxNestingDepth) + "1" + strings.Repeat("}", api.MaxNestingDepth) + "}"
	r = runCLI(t, "", "apply", "-f", writeFile(t, "deep.json", `{"items":[`+one+`]}`), "--cp", cp)
	g.Expect(r.err).To(MatchError("1 of 1 documents were not applied"))
	g.Expect(r.stderr).To(HavePrefix("error: "))
	g.Expect(r.stderr).To(ContainSubstring(": Mesh/deep: 400 Resource is not valid: body: nests too deep"))
}
