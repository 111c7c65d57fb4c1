package controlplane_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/internal/testbin"
)

// openAt opens the store dsn names (the SQLite file under dataDir when dsn is "").
func openAt(t *testing.T, dsn, dataDir string) store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), dsn, dataDir)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func idOf(t *testing.T, st store.Store) string {
	t.Helper()
	id, err := st.ID(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func readMarker(t *testing.T, dataDir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, controlplane.StoreIDFile))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func putMesh(t *testing.T, st store.Store, name string) {
	t.Helper()
	if _, _, err := st.Put(context.Background(), resource.Resource{Kind: resource.MeshKind, Name: name, Spec: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
}

// truncate empties the SQLite file, as a lost disk or a careless `> kds.db` does. A clean stop
// leaves no WAL beside it; any that a test's crash left is removed, so only the truncation counts.
func truncate(t *testing.T, path string) {
	t.Helper()
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	for _, side := range []string{"-wal", "-shm"} {
		if err := os.Remove(path + side); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
}

func TestStoreIdentityOnSQLite(t *testing.T) {
	g, ctx := NewWithT(t), context.Background()
	dir := t.TempDir()
	dbFile := filepath.Join(dir, store.DefaultSQLiteFile)
	marker := filepath.Join(dir, controlplane.StoreIDFile)
	var logs bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})

	// First start: the id is recorded, readable by this user alone.
	st := openAt(t, "", dir)
	first := idOf(t, st)
	g.Expect(controlplane.CheckStoreIdentity(ctx, st, dir, false, log)).To(Succeed())
	g.Expect(readMarker(t, dir)).To(Equal(first + "\n"))
	info, err := os.Stat(marker)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(info.Mode().Perm()).To(Equal(os.FileMode(0o600)))
	putMesh(t, st, "default")
	g.Expect(st.Close()).To(Succeed())

	// Restart on the same store.
	st = openAt(t, "", dir)
	g.Expect(controlplane.CheckStoreIdentity(ctx, st, dir, false, log)).To(Succeed())
	g.Expect(st.Close()).To(Succeed())

	// The file truncated to 0 bytes opens as a new, empty store with a new id: refused.
	truncate(t, dbFile)
	st = openAt(t, "", dir)
	second := idOf(t, st)
	g.Expect(second).NotTo(Equal(first))
	err = controlplane.CheckStoreIdentity(ctx, st, dir, false, log)
	var sie *controlplane.StoreIdentityError
	g.Expect(errors.As(err, &sie)).To(BeTrue(), "got %v", err)
	g.Expect(*sie).To(Equal(controlplane.StoreIdentityError{Marker: marker, Recorded: first, Found: second, Resources: 0}))
	g.Expect(err.Error()).To(And(
		ContainSubstring(marker), ContainSubstring(first), ContainSubstring(second),
		ContainSubstring("holds no resources"), ContainSubstring("restore the store this global served"),
		ContainSubstring("if this new store is intended, accept it")))
	g.Expect(readMarker(t, dir)).To(Equal(first+"\n"), "a refusal changes nothing")

	// Accepted: the new id is recorded, with a warning naming both.
	g.Expect(controlplane.CheckStoreIdentity(ctx, st, dir, true, log)).To(Succeed())
	g.Expect(readMarker(t, dir)).To(Equal(second + "\n"))
	g.Expect(logs.String()).To(MatchRegexp(`\[WARN\] +serving a new store, as asked.*store_id=` + second + `.*previous_store_id=` + first))
	g.Expect(st.Close()).To(Succeed())
	// And from then on it is the store this global serves.
	st = openAt(t, "", dir)
	g.Expect(controlplane.CheckStoreIdentity(ctx, st, dir, false, log)).To(Succeed())
	g.Expect(st.Close()).To(Succeed())

	// Another store's file put in its place (say, another global's backup): refused, and the
	// error says it holds resources.
	otherDir := t.TempDir()
	other := openAt(t, "", otherDir)
	putMesh(t, other, "a")
	putMesh(t, other, "b")
	otherID := idOf(t, other)
	g.Expect(other.Close()).To(Succeed())
	b, err := os.ReadFile(filepath.Join(otherDir, store.DefaultSQLiteFile))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.WriteFile(dbFile, b, 0o600)).To(Succeed())
	st = openAt(t, "", dir)
	err = controlplane.CheckStoreIdentity(ctx, st, dir, false, log)
	g.Expect(errors.As(err, &sie)).To(BeTrue(), "got %v", err)
	g.Expect(*sie).To(Equal(controlplane.StoreIdentityError{Marker: marker, Recorded: second, Found: otherID, Resources: 2}))
	g.Expect(err.Error()).To(ContainSubstring("holds 2 resources"))
}

func TestStoreIdentityOfReplicasSharingPostgres(t *testing.T) {
	g, ctx := NewWithT(t), context.Background()
	dsn := pg.Database(t)
	// Two replicas, each with its data dir, record the one id of their shared database.
	a, b := t.TempDir(), t.TempDir()
	for _, dir := range []string{a, b} {
		g.Expect(controlplane.CheckStoreIdentity(ctx, openAt(t, dsn, ""), dir, false, nil)).To(Succeed())
	}
	g.Expect(readMarker(t, a)).To(Equal(readMarker(t, b)))
	g.Expect(controlplane.CheckStoreIdentity(ctx, openAt(t, dsn, ""), a, false, nil)).To(Succeed())

	// Pointed at a new database, a replica refuses it.
	err := controlplane.CheckStoreIdentity(ctx, openAt(t, pg.Database(t), ""), a, false, nil)
	var sie *controlplane.StoreIdentityError
	g.Expect(errors.As(err, &sie)).To(BeTrue(), "got %v", err)
}

func TestStoreIdentityErrors(t *testing.T) {
	g, ctx := NewWithT(t), context.Background()
	st := openAt(t, "", t.TempDir())
	g.Expect(controlplane.CheckStoreIdentity(ctx, st, "", false, nil)).To(MatchError(ContainSubstring("no data dir")))

	// A marker that cannot be read is an error, not a first start.
	dir := t.TempDir()
	g.Expect(os.Mkdir(filepath.Join(dir, controlplane.StoreIDFile), 0o700)).To(Succeed())
	err := controlplane.CheckStoreIdentity(ctx, st, dir, false, nil)
	g.Expect(err).To(MatchError(ContainSubstring("read the id of the store this global served")))
}

// TestGlobalRefusesATruncatedStore runs the real binary: a global whose SQLite file was
// truncated to 0 bytes exits non-zero and says why and what to do.
func TestGlobalRefusesATruncatedStore(t *testing.T) {
	g := NewWithT(t)
	bin := testbin.Build(t, "./host/cmd/kds-host")
	dir := t.TempDir()
	args := []string{"--mode", "global", "--data-dir", dir, "--kds-plaintext",
		"--kds-addr", "127.0.0.1:0", "--api-addr", "127.0.0.1:0", "--diag-addr", "127.0.0.1:0"}

	// start runs the global until the marker holds an id that want accepts, then stops it.
	start := func(env []string, want func(marker string) bool) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		g.Expect(cmd.Start()).To(Succeed())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		defer func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
				t.Errorf("the global did not stop on SIGTERM; its log:\n%s", stderr.String())
			}
		}()
		g.Eventually(func() bool {
			b, _ := os.ReadFile(filepath.Join(dir, controlplane.StoreIDFile))
			return want(string(b))
		}).WithTimeout(30*time.Second).WithPolling(20*time.Millisecond).Should(BeTrue(), func() string { return stderr.String() })
		g.Consistently(exited).WithTimeout(100 * time.Millisecond).ShouldNot(Receive())
	}
	var first string
	start(nil, func(m string) bool { first = m; return m != "" })
	truncate(t, filepath.Join(dir, store.DefaultSQLiteFile))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	g.Expect(errors.As(err, &exit)).To(BeTrue(), "want a non-zero exit, got %v; stderr:\n%s", err, stderr.String())
	g.Expect(exit.ExitCode()).To(Equal(1))
	g.Expect(stderr.String()).To(And(
		ContainSubstring("store identity: "+filepath.Join(dir, controlplane.StoreIDFile)),
		ContainSubstring(strings.TrimSpace(first)), ContainSubstring("holds no resources"),
		ContainSubstring("--accept-new-store"), ContainSubstring("KDS_ACCEPT_NEW_STORE=true")))
	g.Expect(readMarker(t, dir)).To(Equal(first))

	// With the environment twin of --accept-new-store, the new store is served and recorded.
	start([]string{"KDS_ACCEPT_NEW_STORE=true"}, func(m string) bool { return m != "" && m != first })
}
