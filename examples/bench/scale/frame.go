package main

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/examples/bench/internal/benchproc"
	"github.com/kds-host/kds-host/examples/bench/internal/fleetproc"
	"github.com/kds-host/kds-host/host/resource"
)

// frame is what a zone of the fleet reads of a response, straight from its wire form: its type,
// nonce and version, which resources of the bench it carries (benchproc.Index), and the target's
// resource when it carries the target. The fleet stands in for clients that run on machines of
// their own; decoding every resource it only counts would spend the cores it shares with the
// server under test (a full decode was over half of the zones' CPU at 10,000 x 100), so it reads
// names alone, as the server wrote them.
type frame struct {
	sotw    bool // a DiscoveryResponse, else a DeltaDiscoveryResponse
	typeURL string
	nonce   string
	version string
	indexes []int      // benchproc indexes of the resources it carries, in order
	target  *anypb.Any // the target's resource, when it carries it
}

// frameCodec reads responses into a *frame, and marshals requests as the proto codec does. It
// is a call option of the fleet's streams only.
type frameCodec struct {
	proto encoding.CodecV2
	bufs  *sync.Pool // of *[]byte: a response spread over several buffers, made one
}

func newFrameCodec() frameCodec {
	return frameCodec{proto: encoding.GetCodecV2("proto"), bufs: &sync.Pool{New: func() any { return new([]byte) }}}
}

func (c frameCodec) Name() string { return "proto" }

func (c frameCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c frameCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	if len(data) == 1 {
		return f.parse(data[0].ReadOnlyData())
	}
	buf := c.bufs.Get().(*[]byte)
	defer c.bufs.Put(buf)
	if n := data.Len(); cap(*buf) < n {
		*buf = make([]byte, n)
	} else {
		*buf = (*buf)[:n]
	}
	data.CopyTo(*buf)
	return f.parse(*buf)
}

// parse reads a response; b is only valid during the call, and f keeps nothing of it.
func (f *frame) parse(b []byte) error {
	f.typeURL, f.nonce, f.version, f.target, f.indexes = "", "", "", nil, f.indexes[:0]
	// Both responses: 2 resources, 4 type_url, 5 nonce; SotW's version_info is 1. The type comes
	// after the resources, and names the index they have: a first pass finds it.
	err := fleetproc.EachField(b, func(num protowire.Number, v []byte) error {
		switch {
		case num == 1 && f.sotw:
			f.version = string(v)
		case num == 4:
			f.typeURL = string(v)
		case num == 5:
			f.nonce = string(v)
		}
		return nil
	})
	if err == nil {
		err = fleetproc.EachField(b, func(num protowire.Number, v []byte) error {
			if num != 2 {
				return nil
			}
			if f.sotw { // Any{type_url 1, value 2}
				url, value, err := anyOf(v)
				if err == nil {
					i, ok := benchproc.Index(f.typeURL, xdsNameOf(value))
					f.add(i, ok, url, value)
				}
				return err
			}
			var name, url, value []byte // Resource{version 1, resource 2 (Any), name 3, ...}
			err := fleetproc.EachField(v, func(num protowire.Number, v []byte) error {
				var err error
				switch num {
				case 2:
					url, value, err = anyOf(v)
				case 3:
					name = v
				}
				return err
			})
			if err == nil {
				// Index keeps no part of the name, which lives in b only for this call.
				i, ok := benchproc.Index(f.typeURL, unsafe.String(unsafe.SliceData(name), len(name)))
				f.add(i, ok, url, value)
			}
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("read a response: %w", err)
	}
	return nil
}

// add counts resource i, if ok, and keeps a copy of its Any when it is the target.
func (f *frame) add(i int, ok bool, url, value []byte) {
	if !ok {
		return
	}
	f.indexes = append(f.indexes, i)
	if i == benchproc.Target {
		f.target = &anypb.Any{TypeUrl: string(url), Value: append([]byte(nil), value...)}
	}
}

// anyOf reads an Any's type URL and value.
func anyOf(b []byte) (url, value []byte, err error) {
	err = fleetproc.EachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case 1:
			url = v
		case 2:
			value = v
		}
		return nil
	})
	return url, value, err
}

// errDone stops eachField early.
var errDone = errors.New("done")

// xdsNameOf reads a kds.v1.Resource's xDS name (mesh/name, or name) from its wire form: fields 2
// (name) and 3 (mesh), which come first after the kind; "" when it is not one.
func xdsNameOf(b []byte) string {
	var name, mesh string
	_ = fleetproc.EachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case 2:
			name = string(v)
		case 3:
			mesh = string(v)
		}
		if num > 3 {
			return errDone
		}
		return nil
	})
	return resource.Key{Mesh: mesh, Name: name}.XDSName()
}
