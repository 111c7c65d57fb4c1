package store

import (
	"sync/atomic"
	"time"
)

// OperationObserver is told, after each store operation, its name (one of Operations), how long
// it took and the error it returned. It runs on the caller's goroutine: it must record and return.
type OperationObserver func(op string, took time.Duration, err error)

// The operations an OperationObserver is told of.
const (
	opGet               = "get"
	opList              = "list"
	opRevision          = "revision"
	opChangesSince      = "changes_since"
	opWrite             = "write"
	opWriteBatch        = "write_batch"
	opDelete            = "delete"
	opApply             = "apply"
	opMeta              = "meta"
	opSetMeta           = "set_meta"
	opSpaceProbe        = "space_probe"
	opRecordZoneStreams = "record_zone_streams"
	opZoneStreams       = "zone_streams"
	opKnownZones        = "known_zones"
	opForgetZone        = "forget_zone"
)

// Operations are the names an OperationObserver is told: Put is timed as a write, ID as a meta
// read, OtherZoneStreams as zone_streams.
var Operations = []string{opGet, opList, opRevision, opChangesSince, opWrite, opWriteBatch, opDelete, opApply,
	opMeta, opSetMeta, opSpaceProbe, opRecordZoneStreams, opZoneStreams, opKnownZones, opForgetZone}

// Observable is a Store that tells an observer how long each of its operations took, as every
// Store Open returns is.
type Observable interface {
	// ObserveOperations sets the observer of every operation from now on (nil: none).
	ObserveOperations(OperationObserver)
}

// operationObserver holds a store's observer.
type operationObserver struct {
	f atomic.Pointer[OperationObserver]
}

// ObserveOperations implements Observable.
func (s *sqlStore) ObserveOperations(o OperationObserver) {
	if o == nil {
		s.observer.f.Store(nil)
		return
	}
	s.observer.f.Store(&o)
}

// timed tells the observer, if any, that op began at began and returned *err.
func (s *sqlStore) timed(op string, began time.Time, err *error) {
	if o := s.observer.f.Load(); o != nil {
		(*o)(op, time.Since(began), *err)
	}
}
