package zone

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"

	. "github.com/onsi/gomega"
)

// What the zone's open answers show of an error: its configured files by their flags, any other
// file an *fs.PathError names left out, and everything else as it was.
func TestAZonesPublicErrorNamesNoFilePath(t *testing.T) {
	c := &Client{cfg: Config{TokenFile: "/etc/kds/zone.token", TLSCAFile: "ca.pem"}}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"the token file", fmt.Errorf("zone token: %w", &fs.PathError{Op: "open", Path: "/etc/kds/zone.token", Err: syscall.EACCES}),
			"zone token: open the zone token file (--zone-token-file): permission denied"},
		{"a message naming it", errors.New("token file /etc/kds/zone.token is empty"),
			"token file the zone token file (--zone-token-file) is empty"},
		{"a relative CA file, as a word only", errors.New("the CA in ca.pem (--kds-tls-ca); not in ca.pem.bak or xca.pem"),
			"the CA in its CA file (--kds-tls-ca); not in ca.pem.bak or xca.pem"},
		{"another file", fmt.Errorf("x: %w", errors.Join(errors.New("y"), &fs.PathError{Op: "stat", Path: "/var/lib/kds/kds.db", Err: syscall.ENOENT})),
			"x: y\nstat a file: no such file or directory"},
		{"no file", errors.New("reach global grpc://127.0.0.1:5685: connection refused"), "reach global grpc://127.0.0.1:5685: connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			NewWithT(t).Expect(c.publicError(tc.err)).To(Equal(tc.want))
		})
	}
}
