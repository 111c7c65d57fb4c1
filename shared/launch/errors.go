package launch

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-plugin"

	"github.com/kds-host/kds-host/shared"
)

// ErrNotAPlugin is the error (wrapped) for a binary that is not a kds-host plugin: it does not
// complete the go-plugin handshake with kds-host's cookie and protocol, or serves neither kind.
var ErrNotAPlugin = errors.New("not a kds-host plugin")

// ChecksumError is a binary whose SHA-256 is not the one pinned (Options.SHA256), or, with a
// folder pin (Options.PinFolder), a folder whose checksum is not.
type ChecksumError struct {
	Path             string
	Folder           string // set for a folder pin: the folder hashed
	Expected, Actual string // hex
}

func (e *ChecksumError) Error() string {
	if e.Folder != "" {
		return fmt.Sprintf("plugin %s: checksum mismatch of its folder %s: expected sha256-folder:%s, actual sha256-folder:%s (a file in the folder changed, or the pin is wrong)",
			e.Path, e.Folder, e.Expected, e.Actual)
	}
	return fmt.Sprintf("plugin %s: checksum mismatch: expected sha256:%s, actual sha256:%s (the binary changed, or the pin is wrong)",
		e.Path, e.Expected, e.Actual)
}

// startError explains why a start failed, for the person who runs the plugin.
func (p *Process) startError(err error) error {
	path := p.opts.Path
	var pathErr *fs.PathError
	switch {
	case errors.Is(err, plugin.ErrChecksumsDoNotMatch):
		actual, herr := FileSHA256(p.cmd.Path)
		if herr != nil {
			actual = "unknown (" + herr.Error() + ")"
		}
		return &ChecksumError{Path: path, Expected: hex.EncodeToString(p.opts.SHA256), Actual: actual}
	case errors.As(err, &pathErr) && p.copyDir != "" && errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("plugin %s: %w (a pinned binary runs from a copy in %s: is that folder's file system mounted noexec?)",
			path, err, filepath.Dir(p.copyDir))
	case errors.As(err, &pathErr), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("plugin %s: %w", path, err)
	}
	// Everything else is the handshake failing: the program printed something else, said
	// nothing within the start timeout, exited (another cookie), or speaks another version.
	msg, _, _ := strings.Cut(err.Error(), "\n")
	const unrecognized = "Unrecognized remote plugin message: "
	switch {
	case msg == unrecognized+"", msg == "plugin exited before we could connect":
		msg = "it exited without a handshake"
	case strings.HasPrefix(msg, unrecognized):
		msg = fmt.Sprintf("it printed %q instead of a handshake", strings.TrimPrefix(msg, unrecognized))
	case msg == "timeout while waiting for plugin to start":
		msg = fmt.Sprintf("no handshake within the start timeout (%s)", p.opts.StartTimeout)
	}
	if s := p.Stderr(); s != "" {
		msg += "; its stderr: " + s
	}
	return fmt.Errorf("plugin %s: %w (it must answer the go-plugin handshake with kds-host's cookie and protocol version %d): %s",
		path, ErrNotAPlugin, shared.ProtocolVersion, msg)
}
