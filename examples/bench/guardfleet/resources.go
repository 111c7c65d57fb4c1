package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// clusterName is the name of cluster i (0-based).
func clusterName(i int) string { return fmt.Sprintf("cluster-%03d", i) }

// marker is what update seq writes into the cluster it changes (its alt_stat_name): a client
// finds the updates a response carries by looking for it in the bytes, without decoding them.
const marker = "guardfleet-update-"

func markerOf(seq int) string { return fmt.Sprintf("%s%06d", marker, seq) }

// latestUpdate is the highest update whose marker b holds, or -1.
func latestUpdate(b []byte) int {
	latest := -1
	for {
		i := bytes.Index(b, []byte(marker))
		if i < 0 || i+len(marker)+6 > len(b) {
			return latest
		}
		b = b[i+len(marker):]
		if n, err := strconv.Atoi(string(b[:6])); err == nil && n > latest {
			latest = n
		}
	}
}

// clusterAt is cluster i after updates 0..applied (-1: none): a static cluster with one
// endpoint, nothing it references; the update that last changed it (i, i+clusters, ...) is in
// its alt_stat_name and its connect timeout.
func clusterAt(i, clusters, applied int) *cluster.Cluster {
	c := &cluster.Cluster{
		Name:                 clusterName(i),
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(time.Second),
		LoadAssignment: &endpoint.ClusterLoadAssignment{ClusterName: clusterName(i), Endpoints: []*endpoint.LocalityLbEndpoints{{
			LbEndpoints: []*endpoint.LbEndpoint{{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
					Address: "127.0.0.1", PortSpecifier: &core.SocketAddress_PortValue{PortValue: uint32(10000 + i)}}}}}}}},
		}}},
	}
	last := -1
	for seq := i; seq <= applied; seq += clusters {
		last = seq
	}
	if last >= 0 {
		c.AltStatName = markerOf(last)
		c.ConnectTimeout = durationpb.New(time.Duration(last+2) * time.Second)
	}
	return c
}

// resourcesFile is the resources file (examples/xds-server's contract, JSON) after updates
// 0..applied: update seq changes cluster seq % clusters, one cluster at a time.
func resourcesFile(clusters, applied int) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString("{\"resources\": [\n")
	for i := range clusters {
		a, err := anypb.New(clusterAt(i, clusters, applied))
		if err != nil {
			return nil, err
		}
		b, err := protojson.Marshal(a)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			buf.WriteString(",\n")
		}
		buf.Write(b)
	}
	buf.WriteString("\n]}\n")
	return buf.Bytes(), nil
}

// writeResources writes the file after updates 0..applied elsewhere and renames it into place,
// as the contract asks; it returns the moment the rename returned.
func writeResources(file string, clusters, applied int) (time.Time, error) {
	b, err := resourcesFile(clusters, applied)
	if err != nil {
		return time.Time{}, err
	}
	tmp := filepath.Join(filepath.Dir(file), ".next-"+filepath.Base(file))
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return time.Time{}, err
	}
	if err := os.Rename(tmp, file); err != nil {
		return time.Time{}, err
	}
	return time.Now(), nil
}
