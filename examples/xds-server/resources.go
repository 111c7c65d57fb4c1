package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	// The Envoy types a resources file may hold, registered for protojson's Any: the xDS
	// resources themselves, and the extensions they commonly embed.
	_ "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/ring_hash/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/wrr_locality/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/service/runtime/v3"
)

// snapshotKey is the one SnapshotCache key: every node sees the same resources.
const snapshotKey = "all"

// allNodes is the SnapshotCache's NodeHash: one constant key for every node.
type allNodes struct{}

func (allNodes) ID(*core.Node) string { return snapshotKey }

// pollInterval is how often the resources file's modification time and size are checked.
const pollInterval = 500 * time.Millisecond

// document is the shape of a resources file.
type document struct {
	Resources []json.RawMessage `json:"resources"`
}

// parseResources reads a resources file (YAML or JSON): a `resources:` list of Envoy v3
// resources, each the protobuf JSON of an Any with its "@type".
func parseResources(data []byte) (map[string][]types.Resource, int, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, 0, fmt.Errorf("not YAML or JSON: %w", err)
	}
	var doc document
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, 0, fmt.Errorf("want a document with a resources: list: %w", err)
	}
	out := map[string][]types.Resource{}
	seen := map[string]bool{}
	for i, raw := range doc.Resources {
		var a anypb.Any
		if err := protojson.Unmarshal(raw, &a); err != nil {
			return nil, 0, fmt.Errorf("resources[%d]: %w", i, err)
		}
		typeURL := a.GetTypeUrl()
		if cache.GetResponseType(typeURL) == types.UnknownType {
			return nil, 0, fmt.Errorf("resources[%d]: @type %q is not an xDS resource type this server serves", i, typeURL)
		}
		m, err := a.UnmarshalNew()
		if err != nil {
			return nil, 0, fmt.Errorf("resources[%d] (%s): %w", i, typeURL, err)
		}
		name := cache.GetResourceName(m)
		if name == "" {
			return nil, 0, fmt.Errorf("resources[%d] (%s): no name", i, typeURL)
		}
		if seen[typeURL+"\x00"+name] {
			return nil, 0, fmt.Errorf("resources[%d]: two %s named %q", i, typeURL, name)
		}
		seen[typeURL+"\x00"+name] = true
		out[typeURL] = append(out[typeURL], m)
	}
	return out, len(doc.Resources), nil
}

// fileState is what the poller compares to notice a change.
type fileState struct {
	mod  time.Time
	size int64
}

// source serves a resources file through a SnapshotCache: each change of the file that parses
// is a new snapshot version.
type source struct {
	file    string
	cache   cache.SnapshotCache
	log     hclog.Logger
	version int
	last    fileState
	sum     string // sha256 of the content last served
}

// load reads the file and, if it parses and differs from what is served, sets a new snapshot.
func (s *source) load(ctx context.Context) error {
	st, err := os.Stat(s.file)
	if err != nil {
		return err
	}
	s.last = fileState{st.ModTime(), st.Size()}
	data, err := os.ReadFile(s.file)
	if err != nil {
		return err
	}
	h := sha256.Sum256(data)
	sum := hex.EncodeToString(h[:])
	if sum == s.sum {
		return nil // touched, not changed
	}
	res, n, err := parseResources(data)
	if err != nil {
		return err
	}
	version := fmt.Sprintf("%d-%s", s.version+1, sum[:8])
	snap, err := cache.NewSnapshot(version, res)
	if err != nil {
		return err
	}
	// No snap.Consistent(): it does not follow an API listener's RDS reference (grpc-go's
	// listeners), and a client waits for what is missing anyway.
	if err := s.cache.SetSnapshot(ctx, snapshotKey, snap); err != nil {
		return err
	}
	s.version++
	s.sum = sum
	counts := make([]string, 0, len(res))
	for t, rs := range res {
		counts = append(counts, fmt.Sprintf("%s=%d", shortType(t), len(rs)))
	}
	sort.Strings(counts)
	s.log.Info("serving resources", "file", s.file, "version", version, "resources", n, "by_type", counts)
	return nil
}

// watch polls the file until ctx ends; a change that does not parse is logged and the
// previous resources stay served.
func (s *source) watch(ctx context.Context) {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := os.Stat(s.file)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) || s.last != (fileState{}) {
				s.log.Error("cannot read the resources file; the previous resources stay served", "file", s.file, "error", err)
			}
			s.last = fileState{} // report it once; a file that comes back is read again
			continue
		}
		if (fileState{st.ModTime(), st.Size()}) == s.last {
			continue
		}
		if err := s.load(ctx); err != nil {
			s.log.Error("the resources file does not load; the previous resources stay served", "file", s.file, "error", err)
		}
	}
}

func shortType(typeURL string) string {
	for i := len(typeURL) - 1; i >= 0; i-- {
		if typeURL[i] == '.' {
			return typeURL[i+1:]
		}
	}
	return typeURL
}
