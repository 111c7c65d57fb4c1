package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
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

// Why a read of the resources file is refused: the reason label of
// kds_xds_resources_file_refused_total.
const (
	refusedRead       = "read"         // the file cannot be opened or read (missing, permissions)
	refusedTooLarge   = "too_large"    // over --max-resources-bytes
	refusedEmptyFile  = "empty_file"   // no document: zero bytes, whitespace or comments only, without --allow-empty
	refusedNoResource = "no_resources" // {}, resources: null, or resources: [] without --allow-empty
	refusedParse      = "parse"        // not YAML or JSON, or not a document with a resources: list
	refusedResource   = "bad_resource" // a resource that does not decode or cannot be served
)

// refusedReasons are the reasons, in the order /metrics lists them.
var refusedReasons = []string{refusedRead, refusedTooLarge, refusedEmptyFile, refusedNoResource, refusedParse, refusedResource}

// refusal is why a read of the resources file is not served.
type refusal struct {
	reason string // one of refusedReasons
	err    error
}

func (r *refusal) Error() string { return r.reason + ": " + r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

func refuse(reason, format string, args ...any) *refusal {
	return &refusal{reason: reason, err: fmt.Errorf(format, args...)}
}

// document is the shape of a resources file.
type document struct {
	Resources *[]json.RawMessage `json:"resources"` // nil: no resources: list, or null
}

// parseResources reads a resources file (YAML or JSON): a `resources:` list of Envoy v3
// resources, each the protobuf JSON of an Any with its "@type". It refuses, with a *refusal:
//   - a file with no document (empty, whitespace or comments only), unless allowEmpty:
//     empty_file;
//   - a document without a resources: list ({} or resources: null), or an empty list, unless
//     allowEmpty: no_resources;
//   - text that is not YAML or JSON (the error names the line), or another document: parse;
//   - a resource that does not decode, of a type not served, without a name or named twice:
//     bad_resource, naming its index.
func parseResources(data []byte, allowEmpty bool) (map[string][]types.Resource, int, error) {
	js := data // JSON is read as it is: converting it as YAML costs several times its size
	if !json.Valid(data) {
		var err error
		if js, err = yaml.YAMLToJSON(data); err != nil {
			return nil, 0, refuse(refusedParse, "not YAML or JSON: %w", err)
		}
	}
	if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		if allowEmpty {
			return map[string][]types.Resource{}, 0, nil
		}
		return nil, 0, refuse(refusedEmptyFile, "the file holds no document (a truncated or half-written file?); "+
			"to serve no resources, run with --allow-empty")
	}
	var doc document
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, 0, refuse(refusedParse, "want a document with a resources: list: %w", err)
	}
	if doc.Resources == nil {
		if allowEmpty {
			return map[string][]types.Resource{}, 0, nil
		}
		return nil, 0, refuse(refusedNoResource, "the document has no resources: list ({} or resources: null); "+
			"to serve no resources, run with --allow-empty")
	}
	if len(*doc.Resources) == 0 && !allowEmpty {
		return nil, 0, refuse(refusedNoResource, "resources: [] would remove every resource from every client; "+
			"run with --allow-empty to serve an empty set")
	}
	out := map[string][]types.Resource{}
	seen := map[string]bool{}
	for i, raw := range *doc.Resources {
		var a anypb.Any
		if err := protojson.Unmarshal(raw, &a); err != nil {
			return nil, 0, refuse(refusedResource, "resources[%d]: %w", i, err)
		}
		typeURL := a.GetTypeUrl()
		if cache.GetResponseType(typeURL) == types.UnknownType {
			return nil, 0, refuse(refusedResource, "resources[%d]: @type %q is not an xDS resource type this server serves", i, typeURL)
		}
		m, err := a.UnmarshalNew()
		if err != nil {
			return nil, 0, refuse(refusedResource, "resources[%d] (%s): %w", i, typeURL, err)
		}
		name := cache.GetResourceName(m)
		if name == "" {
			return nil, 0, refuse(refusedResource, "resources[%d] (%s): no name", i, typeURL)
		}
		if seen[typeURL+"\x00"+name] {
			return nil, 0, refuse(refusedResource, "resources[%d]: two %s named %q", i, typeURL, name)
		}
		seen[typeURL+"\x00"+name] = true
		out[typeURL] = append(out[typeURL], m)
	}
	return out, len(*doc.Resources), nil
}

func shortType(typeURL string) string {
	for i := len(typeURL) - 1; i >= 0; i-- {
		if typeURL[i] == '.' {
			return typeURL[i+1:]
		}
	}
	return typeURL
}
