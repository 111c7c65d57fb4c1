package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// noReread turns the fallback re-read off, so what a test sees came through the file watch.
const noReread = "--resources-reread=0"

// deltaStream is a raw go-control-plane delta ADS client stream for Clusters.
type deltaStream struct {
	resps chan *discovery.DeltaDiscoveryResponse
	errs  chan error
}

// dialDelta subscribes to the Clusters names on a delta stream and ACKs each response.
func dialDelta(t *testing.T, addr string, names ...string) *deltaStream {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); conn.Close() })
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &core.Node{Id: "delta-node"}
	if err := st.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ClusterType, ResourceNamesSubscribe: names}); err != nil {
		t.Fatal(err)
	}
	d := &deltaStream{resps: make(chan *discovery.DeltaDiscoveryResponse, 16), errs: make(chan error, 1)}
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				d.errs <- err
				return
			}
			d.resps <- r
			if err := st.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ClusterType, ResponseNonce: r.GetNonce()}); err != nil {
				d.errs <- err
				return
			}
		}
	}()
	return d
}

// refusedLog matches the ERROR line of a refusal of file for reason.
func refusedLog(file, reason string) *regexp.Regexp {
	return regexp.MustCompile(`\[ERROR\].*the resources file is refused; the last good resources stay served: file=` +
		regexp.QuoteMeta(file) + ` reason=` + reason + ` error=`)
}

func metric(s *started, t *testing.T) func() string {
	return func() string { _, body := s.get(t, "/metrics"); return body }
}

// TestAFileThatWouldRemoveEveryResourceOrDoesNotReadIsRefusedAndTheLastGoodSetStaysServed
// empties the file in place (`: > file`) or renames each other kind of bad file into place, as
// an editor would: the server logs an ERROR naming the file and why, counts it once by reason,
// /readyz says so, neither a SotW nor a delta client is sent anything, a new client gets the
// last good set, and the next good file is served again. (A write in place in two syscalls
// could be read between them on a loaded machine, and counted twice.)
func TestAFileThatWouldRemoveEveryResourceOrDoesNotReadIsRefusedAndTheLastGoodSetStaysServed(t *testing.T) {
	example, err := os.ReadFile("testdata/resources.yaml")
	if err != nil {
		t.Fatal(err)
	}
	exampleJSON, err := yaml.YAMLToJSON(example)
	if err != nil {
		t.Fatal(err)
	}
	limit := len(example) + 64
	for _, c := range []struct {
		name    string
		content string
		reason  string
	}{
		{"an empty file", "", refusedEmptyFile},
		{"comments only", "# resources come later\n", refusedEmptyFile},
		{"{}", "{}\n", refusedNoResource},
		{"resources: null", "resources: null\n", refusedNoResource},
		{"an empty list without --allow-empty", "resources: []\n", refusedNoResource},
		{"half of the JSON", string(exampleJSON[:len(exampleJSON)/2]), refusedParse},
		{"YAML that does not parse", "resources:\n  - {\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster, name: [oops]\n", refusedParse},
		{"a resource of a type not served", "resources:\n  - {\"@type\": type.googleapis.com/no.such.Type, name: x}\n", refusedResource},
		{"a file over --max-resources-bytes", string(example) + "#" + strings.Repeat("-", 100) + "\n", refusedTooLarge},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			file := filepath.Join(t.TempDir(), "resources.yaml")
			writeFile(t, file, string(example))
			s := start(t, file, noReread, "--max-resources-bytes", strconv.Itoa(limit))
			a := dial(t, s.xds)
			a.send(t, &discovery.DiscoveryRequest{})
			r1 := a.recv(t)
			a.send(t, &discovery.DiscoveryRequest{VersionInfo: r1.GetVersionInfo(), ResponseNonce: r1.GetNonce()})
			d := dialDelta(t, s.xds, "greeter-cluster")
			g.Eventually(d.resps, 10*time.Second).Should(Receive())

			if c.content == "" {
				must(t, os.Truncate(file, 0))
			} else {
				replaceFile(t, file, c.content)
			}
			g.Eventually(s.logs.String, 10*time.Second).Should(MatchRegexp(refusedLog(file, c.reason).String()))
			g.Expect(metric(s, t)()).To(And(
				ContainSubstring(`kds_xds_resources_file_refused_total{reason="`+c.reason+`"} 1`),
				ContainSubstring("kds_xds_resources_file_refusing 1"),
				ContainSubstring("kds_xds_resources_file_loaded_resources 4")))
			code, body := s.get(t, "/readyz")
			g.Expect(code).To(Equal(503))
			g.Expect(body).To(ContainSubstring(c.reason))
			code, body = s.get(t, "/healthz")
			g.Expect(code).To(Equal(200))
			g.Expect(body).To(HavePrefix("ok: the resources file was refused"))
			g.Consistently(a.resps, 300*time.Millisecond).ShouldNot(Receive())
			g.Consistently(d.resps, 100*time.Millisecond).ShouldNot(Receive())
			b := dial(t, s.xds)
			b.send(t, &discovery.DiscoveryRequest{})
			g.Expect(clusters(t, b.recv(t))).To(HaveKey("greeter-cluster"))

			replaceFile(t, file, strings.Replace(string(example), "connect_timeout: 1s", "connect_timeout: 2s", 1))
			var r2 *discovery.DiscoveryResponse
			g.Eventually(a.resps, 10*time.Second).Should(Receive(&r2))
			g.Expect(clusters(t, r2)["greeter-cluster"].GetConnectTimeout().AsDuration()).To(Equal(2 * time.Second))
			// The client may hear of the new version a moment before the server records it.
			g.Eventually(func() int { code, _ := s.get(t, "/readyz"); return code }, 5*time.Second).Should(Equal(200))
			g.Expect(metric(s, t)()).To(ContainSubstring("kds_xds_resources_file_refusing 0"))
		})
	}
}

// TestAllowEmptyServesAnEmptyFileAsNoResources: with --allow-empty, an empty file removes every
// Cluster from a client, as resources: [] does; what does not parse is still refused.
func TestAllowEmptyServesAnEmptyFileAsNoResources(t *testing.T) {
	g := NewWithT(t)
	file := filepath.Join(t.TempDir(), "resources.yaml")
	writeFile(t, file, mustRead(t, "testdata/resources.yaml"))
	s := start(t, file, noReread, "--allow-empty")
	a := dial(t, s.xds)
	a.send(t, &discovery.DiscoveryRequest{})
	r1 := a.recv(t)
	a.send(t, &discovery.DiscoveryRequest{VersionInfo: r1.GetVersionInfo(), ResponseNonce: r1.GetNonce()})

	writeFile(t, file, "resources: [ {")
	g.Eventually(s.logs.String, 10*time.Second).Should(MatchRegexp(refusedLog(file, refusedParse).String()))
	g.Consistently(a.resps, 300*time.Millisecond).ShouldNot(Receive())

	writeFile(t, file, "")
	var r2 *discovery.DiscoveryResponse
	g.Eventually(a.resps, 10*time.Second).Should(Receive(&r2))
	g.Expect(r2.GetResources()).To(BeEmpty())
	g.Eventually(func() int { code, _ := s.get(t, "/readyz"); return code }, 5*time.Second).Should(Equal(200))
}

// TestAFileRefusedAtStartIsAnErrorNamingWhy: the process does not start serving a file it
// would refuse later, and says why.
func TestAFileRefusedAtStartIsAnErrorNamingWhy(t *testing.T) {
	for _, c := range []struct {
		name, content string
		args          []string
		want          string // "": it starts
	}{
		{"an empty file", "", nil, refusedEmptyFile},
		{"an empty file with --allow-empty", "", []string{"--allow-empty"}, ""},
		{"{} with --allow-empty", "{}\n", []string{"--allow-empty"}, ""},
		{"resources: null", "resources: null\n", nil, refusedNoResource},
		{"an empty list", "resources: []\n", nil, refusedNoResource},
		{"an empty list with --allow-empty", "resources: []\n", []string{"--allow-empty"}, ""},
		{"over --max-resources-bytes", mustRead(t, "testdata/resources.yaml"), []string{"--max-resources-bytes", "1000"}, refusedTooLarge},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			file := filepath.Join(t.TempDir(), "resources.yaml")
			writeFile(t, file, c.content)
			if c.want == "" {
				start(t, file, c.args...)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			args := append([]string{"--resources", file, "--xds-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}, c.args...)
			err := runWith(ctx, args, nil, hooks{logOut: &syncBuffer{}})
			g.Expect(err).To(MatchError(And(ContainSubstring(file), ContainSubstring(c.want+": "))))
		})
	}
}

// TestAFileReplacedWithTheSameSizeAndTimeIsServedFromTheWatch replaces the file's content with
// one of the same size and modification time, as rename-into-place, a re-pointed symbolic link
// and a Kubernetes ConfigMap's ..data swap do: a client gets the new content, with the
// fallback re-read off.
func TestAFileReplacedWithTheSameSizeAndTimeIsServedFromTheWatch(t *testing.T) {
	example := mustRead(t, "testdata/resources.yaml")
	changed := strings.Replace(example, "connect_timeout: 1s", "connect_timeout: 2s", 1)
	// sameTime writes content to name with the modification time of the file at like.
	sameTime := func(t *testing.T, name, content, like string) {
		t.Helper()
		writeFile(t, name, content)
		st, err := os.Stat(like)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(name, st.ModTime(), st.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		// setup lays out dir and returns the file to serve; swap changes its content.
		setup func(t *testing.T, dir string) string
		swap  func(t *testing.T, dir string)
	}{
		{"rename into place",
			func(t *testing.T, dir string) string {
				writeFile(t, filepath.Join(dir, "resources.yaml"), example)
				return filepath.Join(dir, "resources.yaml")
			},
			func(t *testing.T, dir string) {
				sameTime(t, filepath.Join(dir, ".resources.yaml.tmp"), changed, filepath.Join(dir, "resources.yaml"))
				must(t, os.Rename(filepath.Join(dir, ".resources.yaml.tmp"), filepath.Join(dir, "resources.yaml")))
			}},
		{"a symbolic link re-pointed",
			func(t *testing.T, dir string) string {
				writeFile(t, filepath.Join(dir, "a.yaml"), example)
				must(t, os.Symlink("a.yaml", filepath.Join(dir, "resources.yaml")))
				return filepath.Join(dir, "resources.yaml")
			},
			func(t *testing.T, dir string) {
				sameTime(t, filepath.Join(dir, "b.yaml"), changed, filepath.Join(dir, "a.yaml"))
				must(t, os.Symlink("b.yaml", filepath.Join(dir, "link.tmp")))
				must(t, os.Rename(filepath.Join(dir, "link.tmp"), filepath.Join(dir, "resources.yaml")))
			}},
		{"a ConfigMap's ..data swap",
			func(t *testing.T, dir string) string {
				must(t, os.Mkdir(filepath.Join(dir, "..v1"), 0o755))
				writeFile(t, filepath.Join(dir, "..v1", "resources.yaml"), example)
				must(t, os.Symlink("..v1", filepath.Join(dir, "..data")))
				must(t, os.Symlink("..data/resources.yaml", filepath.Join(dir, "resources.yaml")))
				return filepath.Join(dir, "resources.yaml")
			},
			func(t *testing.T, dir string) {
				must(t, os.Mkdir(filepath.Join(dir, "..v2"), 0o755))
				sameTime(t, filepath.Join(dir, "..v2", "resources.yaml"), changed, filepath.Join(dir, "..v1", "resources.yaml"))
				must(t, os.Symlink("..v2", filepath.Join(dir, "..data_tmp")))
				must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
				must(t, os.RemoveAll(filepath.Join(dir, "..v1")))
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			g := NewWithT(t)
			dir := t.TempDir()
			s := start(t, c.setup(t, dir), noReread)
			a := dial(t, s.xds)
			a.send(t, &discovery.DiscoveryRequest{})
			r1 := a.recv(t)
			a.send(t, &discovery.DiscoveryRequest{VersionInfo: r1.GetVersionInfo(), ResponseNonce: r1.GetNonce()})

			c.swap(t, dir)
			var r2 *discovery.DiscoveryResponse
			g.Eventually(a.resps, 5*time.Second).Should(Receive(&r2))
			g.Expect(clusters(t, r2)["greeter-cluster"].GetConnectTimeout().AsDuration()).To(Equal(2 * time.Second))
		})
	}
}

// replaceFile writes content beside file and renames it into place.
func replaceFile(t *testing.T, file, content string) {
	t.Helper()
	writeFile(t, file+".tmp", content)
	must(t, os.Rename(file+".tmp", file))
}

func mustRead(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestAJSONFileServesWhatItsYAMLFormServes: JSON is decoded as it is, YAML through its JSON
// form; both give the same resources.
func TestAJSONFileServesWhatItsYAMLFormServes(t *testing.T) {
	g := NewWithT(t)
	example := []byte(mustRead(t, "testdata/resources.yaml"))
	asJSON, err := yaml.YAMLToJSON(example)
	g.Expect(err).NotTo(HaveOccurred())
	fromYAML, n, err := parseResources(example, false)
	g.Expect(err).NotTo(HaveOccurred())
	fromJSON, m, err := parseResources(asJSON, false)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m).To(Equal(n))
	g.Expect(fromJSON).To(HaveLen(len(fromYAML)))
	for typeURL, rs := range fromYAML {
		g.Expect(fromJSON[typeURL]).To(HaveLen(len(rs)))
		for i := range rs {
			g.Expect(proto.Equal(fromJSON[typeURL][i], rs[i])).To(BeTrue(), "%s[%d]", typeURL, i)
		}
	}
}
