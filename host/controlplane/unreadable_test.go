package controlplane_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
)

// storeBeside is a store and a connection of its own to the same database, to write past the
// store as a hand edit, a restore or another version would.
type storeBeside struct {
	store.Store
	db       *sql.DB
	postgres bool
}

func openBeside(t *testing.T, backend string) storeBeside {
	t.Helper()
	driver, dsn, dir := "sqlite", "", t.TempDir()
	raw := "file:" + filepath.Join(dir, store.DefaultSQLiteFile) + "?_pragma=busy_timeout(10000)"
	if backend == "postgres" {
		driver, dsn, dir = "pgx", pg.Database(t), ""
		raw = dsn
	}
	st, err := store.Open(context.Background(), dsn, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	db, err := sql.Open(driver, raw)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return storeBeside{Store: st, db: db, postgres: backend == "postgres"}
}

// set writes value into column of the MeshTimeout default/name. With next, the row is stamped
// with the revision the store's next write takes, so that write's readers see it changed, as
// when another version writes it.
func (s storeBeside) set(t *testing.T, name, column, value string, next bool) {
	t.Helper()
	q := `UPDATE resources SET ` + column + ` = ?`
	if next {
		q += `, revision = (SELECT value FROM revision WHERE id = 1) + 1`
	}
	q += ` WHERE kind = 'MeshTimeout' AND mesh = 'default' AND name = ?`
	if s.postgres {
		q = strings.Replace(strings.Replace(q, "?", "$1", 1), "?", "$2", 1)
	}
	if _, err := s.db.Exec(q, value, name); err != nil {
		t.Fatalf("set %s of %s: %v", column, name, err)
	}
}

// The must-hold line of issue 47: rows with unreadable labels or owners stop no write. One row's
// labels are unreadable before the global starts (it starts, and serves the rest at once);
// another's owners become unreadable while it runs, as another version would write them. A later
// write reaches the zone, both rows are listed in /api/unservable (column and error), on the
// status page and in kds_unservable_resources, each is logged once, /readyz stays ready, and
// the zone keeps the version it was served. Each is served as soon as it is fixed: one written
// again through the store, the other fixed by hand in the database (no revision moves: the
// global reads its unservable rows again every poll tick). Before, the global did not start with
// the first row, and the second stopped every later write to every zone ("stored labels:
// invalid character").
func TestRowsWithUnreadableLabelsOrOwnersStopNoWriteAndAreListed(t *testing.T) {
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			reg := resource.Default()
			st := openBeside(t, backend)
			put(t, st, reg, mesh("default"))
			put(t, st, reg, timeout("default", "bad-labels", "1s"))
			put(t, st, reg, timeout("default", "bad-owners", "1s"))
			st.set(t, "bad-labels", "labels", `{"team":`, false)

			var logs syncBuf
			gl := startGlobal(t, st, reg, func(c *controlplane.GlobalConfig) {
				c.Logger = hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})
			})
			zst := openSQLite(t)
			startZone(t, "zone-1", gl.KDSAddr(), zst, reg)
			badLabels := resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "bad-labels"}
			badOwners := resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "bad-owners"}
			generation := func(key resource.Key) func() int64 {
				return func() int64 {
					r, err := zst.Get(ctx, key)
					if err != nil {
						return 0
					}
					return r.Generation
				}
			}
			g.Eventually(generation(badOwners), 10*time.Second).Should(Equal(int64(1)), "the rest is served at once")

			st.set(t, "bad-owners", "owners", `{"kind":"Mesh"}`, true)
			later := resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "later"}
			began := time.Now()
			put(t, st, reg, timeout("default", later.Name, "2s")) // and commits bad-owners' revision
			g.Eventually(generation(later), 20*time.Second, 10*time.Millisecond).Should(Equal(int64(1)), "a later write reaches the zone")
			t.Logf("%s: the later write reached the zone in %s", backend, time.Since(began))

			type item struct {
				Key        resource.Key `json:"key"`
				Generation int64        `json:"generation"`
				Column     string       `json:"column"`
				Error      string       `json:"error"`
			}
			unservable := func() []item {
				var list struct {
					Items []item `json:"items"`
				}
				g.Expect(apiClient(t, gl.APIAddr()).GetJSON(ctx, "/api/unservable", &list)).To(Succeed())
				return list.Items
			}
			g.Eventually(unservable, 10*time.Second).Should(HaveExactElements(
				item{Key: badLabels, Generation: 1, Column: "labels", Error: "unexpected end of JSON input"},
				item{Key: badOwners, Generation: 1, Column: "owners", Error: "json: cannot unmarshal object into Go value of type []resource.Key"},
			))
			g.Expect(metric(t, gl.DiagAddr(), "kds_unservable_resources")).To(BeEquivalentTo(2))
			g.Expect(codeOf(readyz(t, gl))).To(Equal(200), "the rest is served: ready")
			g.Expect(generation(badLabels)()).To(BeZero(), "never served")
			g.Expect(generation(badOwners)()).To(Equal(int64(1)), "its served version stays")
			if backend == "sqlite" {
				statusPageShowsUnreadable(t, gl.APIAddr())
			}

			// Written again through the store: served at once. Fixed by hand: served within a tick.
			fixed := timeout("default", badOwners.Name, "3s")
			fixed.Owners = []resource.Key{{Kind: "Mesh", Name: "default"}}
			put(t, st, reg, fixed)
			g.Eventually(generation(badOwners), 10*time.Second).Should(Equal(int64(2)))
			st.set(t, "bad-labels", "labels", `{"team":"payments"}`, false)
			g.Eventually(generation(badLabels), 10*time.Second).Should(Equal(int64(1)))
			g.Eventually(unservable, 5*time.Second).Should(BeEmpty())
			g.Expect(metric(t, gl.DiagAddr(), "kds_unservable_resources")).To(BeZero())
			r, err := zst.Get(ctx, badLabels)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Labels).To(HaveKeyWithValue("team", "payments"))

			// Logged once each, whatever the polls that read them again.
			g.Expect(strings.Count(logs.String(), "a stored row cannot be read")).To(Equal(2), logs.String())
			g.Expect(logs.String()).To(And(ContainSubstring("column=labels"), ContainSubstring("column=owners")))
		})
	}
}

// statusPageShowsUnreadable checks that the global's status page lists both unreadable rows
// with their column.
func statusPageShowsUnreadable(t *testing.T, apiAddr string) {
	t.Helper()
	g := NewWithT(t)
	browser := startChromium(t)
	page := browser.open(t)
	page.navigate(t, "http://"+apiAddr+"/gui")
	page.waitFor(t, `!document.getElementById("login").hidden`)
	readOnly := token(t, auth.Claims{Kind: auth.KindUser, Name: "viewer", Groups: []string{auth.GroupReadOnly}})
	page.eval(t, fmt.Sprintf(`document.getElementById("token").value = %s; document.getElementById("login-form").requestSubmit(); true`, mustJSON(t, readOnly)))
	page.waitFor(t, `!document.getElementById("unservable-section").hidden`)
	text := page.text(t, `document.getElementById("unservable")`)
	g.Expect(text).To(And(ContainSubstring("column"), ContainSubstring("default/bad-labels"), ContainSubstring("labels unreadable"),
		ContainSubstring("default/bad-owners"), ContainSubstring("owners unreadable")))
	page.screenshot(t, "unreadable.png")
}

// A zone whose own store holds a row it cannot read still syncs: the row is left out of the
// versions it resumes with, so the global sends it again, and storing it fixes the row. Before,
// the zone could not start a stream ("read the zone's resources: ... stored labels").
func TestAZoneWithAnUnreadableRowOfItsOwnSyncsAndFixesIt(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	reg := resource.Default()
	gst := openSQLite(t)
	zst := openBeside(t, "sqlite")
	for _, st := range []store.Store{gst, zst} {
		put(t, st, reg, mesh("default"))
		put(t, st, reg, timeout("default", "t", "1s"))
	}
	zst.set(t, "t", "labels", `{"team":`, false)

	gl := startGlobal(t, gst, reg)
	startZone(t, "zone-1", gl.KDSAddr(), zst, reg)
	put(t, gst, reg, timeout("default", "later", "2s"))
	g.Eventually(func() error {
		_, err := zst.Get(ctx, resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "later"})
		return err
	}, 10*time.Second).Should(Succeed())
	g.Eventually(func() error { _, err := zst.List(ctx, "", ""); return err }, 10*time.Second).Should(Succeed(), "the row is fixed")
}
