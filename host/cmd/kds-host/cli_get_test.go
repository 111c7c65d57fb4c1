package main

import (
	"database/sql"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/store"
)

// get of a kind with a stored row the store cannot read (labels written by hand) prints the rest
// and, on stderr, a warning naming the row, its column and the error; get of the row itself
// fails with an error naming the column. Before, the whole kind failed (the API answered 500).
func TestGetListsTheRestAndWarnsOfAnUnreadableRow(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	st, err := store.Open(t.Context(), "", dir)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = st.Close() })
	ts := httptest.NewServer(api.New(api.Config{Store: st, Version: "test"}).Handler())
	t.Cleanup(ts.Close)
	cp := ts.URL
	r := runCLI(t, multiDoc, "apply", "-f", "-", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	db, err := sql.Open("sqlite", filepath.Join(dir, store.DefaultSQLiteFile))
	g.Expect(err).NotTo(HaveOccurred())
	defer db.Close()
	_, err = db.Exec(`UPDATE resources SET labels = '{"team":' WHERE name = 'mt-1'`)
	g.Expect(err).NotTo(HaveOccurred())

	r = runCLI(t, "", "get", "meshtimeouts", "-m", "default", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	g.Expect(lines).To(HaveLen(3))
	g.Expect(lines[1:]).To(HaveEach(Not(ContainSubstring("mt-1"))))
	g.Expect(r.stderr).To(Equal("Warning: stored but not listed, the store cannot read them (apply each again, or delete it):\n" +
		"  MeshTimeout default/mt-1: stored labels: unexpected end of JSON input\n"))

	r = runCLI(t, "", "get", "meshtimeouts", "-m", "default", "-o", "json", "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(ContainSubstring(`"unreadable": [`))
	g.Expect(r.stderr).To(ContainSubstring("default/mt-1"))

	r = runCLI(t, "", "get", "meshtimeout", "mt-1", "--cp", cp)
	g.Expect(r.err).To(MatchError(ContainSubstring("MeshTimeout/default/mt-1 is stored, but its labels cannot be read")))
}
