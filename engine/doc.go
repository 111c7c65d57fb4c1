// Package engine serves xDS resources to clients and keeps, for each client stream, what the
// client holds: what it was sent, what it acknowledged and refused, the responses in flight, and
// what must be sent again. A Snapshot goes in; responses and stream events come out. It serves
// go-control-plane's delta server (Cache is its cache.Cache, Tracker its callbacks) or its own
// delta ADS loop (DeltaADS), and knows nothing of stores or plugins.
package engine
