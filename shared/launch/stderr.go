package launch

import (
	"encoding/json"
	"strings"
	"sync"
)

// tail keeps the end of a plugin's stderr.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

// tailSize is how much of a plugin's stderr is kept: enough for a panic's first lines.
const tailSize = 16 << 10

// tailLines is how many lines String shows.
const tailLines = 3

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	// Trimmed once it holds twice what is kept, so a plugin that writes many lines costs a
	// copy of the kept end per tailSize bytes, not per line.
	if len(t.buf) > 2*tailSize {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailSize:]...)
	}
	return len(b), nil
}

// String returns a few lines on one line: a panic and the lines after it, or else the last
// lines; JSON log lines are shown by their level and message.
func (t *tail) String() string {
	t.mu.Lock()
	text := string(t.buf[max(0, len(t.buf)-tailSize):])
	t.mu.Unlock()
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, logMessage(l))
		}
	}
	pick := lines[max(0, len(lines)-tailLines):]
	for i, l := range lines {
		if strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "fatal error:") {
			pick = lines[i:min(len(lines), i+tailLines)]
			break
		}
	}
	return strings.Join(pick, " | ")
}

// logMessage shows an hclog JSON line as "level: message[: error]", and any other line as it is.
func logMessage(line string) string {
	var entry struct {
		Level   string `json:"@level"`
		Message string `json:"@message"`
		Error   string `json:"error"`
	}
	if json.Unmarshal([]byte(line), &entry) != nil || entry.Message == "" {
		return line
	}
	line = entry.Level + ": " + entry.Message
	if entry.Error != "" {
		line += ": " + entry.Error
	}
	return line
}
