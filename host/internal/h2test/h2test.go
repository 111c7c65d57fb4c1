// Package h2test reads what an HTTP/2 peer says of itself first, for tests that hold a gRPC
// server or client to its flow-control settings.
package h2test

import (
	"fmt"

	"golang.org/x/net/http2"
)

// Windows reads a peer's first frames until its SETTINGS and, when they fix a stream window,
// the WINDOW_UPDATE that sets its connection's. It returns the stream window its SETTINGS name
// (0 when they name none: grpc-go's dynamic window, which starts at HTTP/2's 65,535 bytes) and
// the connection's window (0 when no update came with the SETTINGS). It acknowledges the
// SETTINGS, as a peer must.
func Windows(fr *http2.Framer) (stream, conn uint32, err error) {
	settled := false
	for !settled || (stream != 0 && conn == 0) {
		f, err := fr.ReadFrame()
		if err != nil {
			return stream, conn, fmt.Errorf("reading the peer's first frames: %w", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			stream, _ = f.Value(http2.SettingInitialWindowSize)
			settled = true
			if err := fr.WriteSettingsAck(); err != nil {
				return stream, conn, err
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				conn = 65535 + f.Increment
			}
		}
	}
	return stream, conn, nil
}
