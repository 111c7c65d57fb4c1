// Package proto_test checks that the committed generated Go code is what `make proto` makes.
package proto_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestGeneratedCodeIsCurrent regenerates every .proto into a temporary folder with the pinned
// generators (bin/tools, which `make test` builds; the test puts it first on PATH) and compares it
// with the committed code.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	if tools, err := filepath.Abs(filepath.Join("..", "bin", "tools")); err == nil {
		if _, err := os.Stat(filepath.Join(tools, "protoc-gen-go")); err == nil {
			t.Setenv("PATH", tools+string(os.PathListSeparator)+os.Getenv("PATH"))
		}
	}
	for _, tool := range []string{"protoc", "protoc-gen-go", "protoc-gen-go-grpc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not on PATH: run `make tools` (it builds the pinned generators into bin/tools) or `make test` (it does so too; protoc comes from apt-get install protobuf-compiler)", tool)
		}
	}
	protos, err := filepath.Glob("*/v1/*.proto")
	if err != nil || len(protos) == 0 {
		t.Fatalf("no .proto files found: %v", err)
	}
	sort.Strings(protos)
	out := t.TempDir()
	args := append([]string{"-I", ".",
		"--go_out=" + out, "--go_opt=paths=source_relative",
		"--go-grpc_out=" + out, "--go-grpc_opt=paths=source_relative"}, protos...)
	cmd := exec.Command("protoc", args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, b)
	}
	var generated []string
	filepath.WalkDir(out, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(out, p)
			generated = append(generated, rel)
		}
		return nil
	})
	if len(generated) == 0 {
		t.Fatal("protoc generated nothing")
	}
	for _, rel := range generated {
		want, _ := os.ReadFile(filepath.Join(out, rel))
		got, err := os.ReadFile(rel)
		if err != nil {
			t.Errorf("%s is not committed: run `make proto`", rel)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("proto/%s is stale: run `make proto` and commit the result", rel)
		}
	}
	committed, _ := filepath.Glob("*/v1/*.pb.go")
	for _, c := range committed {
		if _, err := os.Stat(filepath.Join(out, c)); err != nil && !strings.HasSuffix(c, "_test.go") {
			t.Errorf("proto/%s has no .proto any more: delete it", c)
		}
	}
}
