package engine

// growStack grows the calling goroutine's stack to 8 KiB at once, while the goroutine is still
// shallow. A stream's goroutine reaches about that depth on its first request (grpc-go's
// receive path, then the request's handling), and the runtime grows a stack by copying it and
// adjusting every frame on it: grown here, one frame is copied instead of ten to twenty later.
// CockroachDB's growstack package does the same for its request goroutines.
//
//go:noinline
func growStack() {
	var buf [5 << 10]byte
	keepFrame(buf[:])
}

// keepFrame makes growStack's buffer live, so that its frame keeps its size.
//
//go:noinline
func keepFrame(b []byte) { _ = b[len(b)-1] }
