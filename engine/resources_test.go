package engine

import (
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/host/resource"
)

// testSnapshots makes the engine tests' snapshots out of kds-host's resources, each as an Entry
// of its kind with its kds.v1 envelope as the payload: the tests read as kds-host's, with names
// such as "m/a" and versions that follow a resource's content.
type testSnapshots struct{ last *Snapshot }

// Build is a snapshot of rs.
func (b *testSnapshots) Build(rs []resource.Resource) (*Snapshot, error) {
	entries := make([]*Entry, 0, len(rs))
	for i := range rs {
		e, err := entryOf(&rs[i])
		if err != nil {
			return nil, err
		}
		entries = append(entries, e)
	}
	b.last = SnapshotOf(entries)
	return b.last, nil
}

// Update is the last snapshot with changed put in and deleted taken out; a resource whose
// version is the one served is left as it is.
func (b *testSnapshots) Update(changed []resource.Resource, deleted []resource.Key) (*Snapshot, error) {
	var put []*Entry
	for i := range changed {
		e, err := entryOf(&changed[i])
		if err != nil {
			return nil, err
		}
		if old := b.last.Type(e.TypeURL)[e.Name]; old == nil || old.Version != e.Version {
			put = append(put, e)
		}
	}
	removed := map[string][]string{}
	for _, k := range deleted {
		if b.last.Type(k.Kind)[k.XDSName()] != nil {
			removed[k.Kind] = append(removed[k.Kind], k.XDSName())
		}
	}
	if len(put) == 0 && len(removed) == 0 {
		return b.last, nil
	}
	b.last = b.last.Update(put, removed)
	return b.last, nil
}

// entryOf is r as an Entry.
func entryOf(r *resource.Resource) (*Entry, error) {
	p, err := r.ToProto()
	if err != nil {
		return nil, err
	}
	a, err := anypb.New(p)
	if err != nil {
		return nil, err
	}
	name, version := r.Key().XDSName(), resource.Version(p)
	e := &Entry{TypeURL: r.Kind, Name: name, Version: version, Any: a, Wire: &discovery.Resource{Name: name, Version: version, Resource: a}}
	return e, e.EncodeWire()
}
