package store

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/resource"
)

func TestWriteResults(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)
		defaults := []resource.Resource{policy("MeshTimeout", "m", "d1", `{}`), policy("MeshRetry", "m", "d2", `{}`)}

		stored, result, err := s.Write(ctx, mesh("m"), defaults)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(result).To(Equal(Created))
		g.Expect(stored.Generation).To(Equal(int64(1)))
		g.Expect(revision(t, s)).To(Equal(int64(1)), "the Mesh and its defaults are one write")
		l, err := s.List(ctx, "", "")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(keys(l)).To(Equal([]string{"Mesh/m", "MeshRetry/m/d2", "MeshTimeout/m/d1"}))
		g.Expect(l).To(HaveEach(HaveField("Generation", int64(1))))
		changed, _, _, err := s.ChangesSince(ctx, 0)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(keys(changed)).To(Equal(keys(l)), "the defaults carry the write's revision")

		// Writing the Mesh again never writes its defaults again: a deleted default stays deleted.
		g.Expect(s.Delete(ctx, defaults[0].Key())).To(Succeed())
		_, result, err = s.Write(ctx, mesh("m"), defaults)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(result).To(Equal(Unchanged))
		m := mesh("m")
		m.Labels = map[string]string{"x": "y"}
		stored, result, err = s.Write(ctx, m, defaults)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(result).To(Equal(Updated))
		g.Expect(stored.Generation).To(Equal(int64(2)))
		_, err = s.Get(ctx, defaults[0].Key())
		g.Expect(err).To(MatchError(ErrNotFound))

		// A generation given for a key that is not stored is a conflict, as with Put.
		withGen := mesh("o")
		withGen.Generation = 3
		_, _, err = s.Write(ctx, withGen, nil)
		g.Expect(err).To(MatchError(ErrConflict))
	})
}

func TestWriteKeepsWhatExists(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)
		// What onCreate names and is stored already is left as it is, the rest is created.
		_, _, err := s.Put(ctx, mesh("other"))
		g.Expect(err).NotTo(HaveOccurred())
		kept := policy("MeshRetry", "other", "d", `{"custom":true}`)
		_, _, err = s.Put(ctx, kept)
		g.Expect(err).NotTo(HaveOccurred())

		_, result, err := s.Write(ctx, mesh("m"), []resource.Resource{
			policy("MeshRetry", "other", "d", `{"default":true}`), policy("MeshTimeout", "m", "d", `{}`),
		})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(result).To(Equal(Created))
		got, err := s.Get(ctx, kept.Key())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(got.Spec)).To(Equal(`{"custom":true}`))
		g.Expect(got.Generation).To(Equal(int64(1)))
		_, err = s.Get(ctx, resource.Key{Kind: "MeshTimeout", Mesh: "m", Name: "d"})
		g.Expect(err).NotTo(HaveOccurred())
	})
}

func TestWriteIsAllOrNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)
		rev := revision(t, s)
		drain(s)
		// The second default names a Mesh that does not exist: the database refuses it in the
		// middle of the transaction, after the Mesh and the first default were written.
		bad := policy("MeshRetry", "absent", "d2", `{}`)
		_, _, err := s.Write(ctx, mesh("m"), []resource.Resource{policy("MeshTimeout", "m", "d1", `{}`), bad})
		g.Expect(err).To(HaveOccurred())
		g.Expect(err.Error()).To(HavePrefix("put Mesh/m: MeshRetry/absent/d2, created with it: "))
		var moe *MissingOwnerError
		g.Expect(errors.As(err, &moe)).To(BeTrue(), "got %v", err)
		g.Expect(moe.Key).To(Equal(bad.Key()))

		l, err := s.List(ctx, "", "")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l).To(BeEmpty())
		g.Expect(revision(t, s)).To(Equal(rev))
		g.Expect(s.Changes()).NotTo(Receive())

		// A default that cannot be encoded fails before anything is written.
		_, _, err = s.Write(ctx, mesh("m"), []resource.Resource{{Kind: "MeshTimeout", Mesh: "m", Name: "d", Spec: json.RawMessage(`{`)}})
		g.Expect(err).To(MatchError(ContainSubstring("put Mesh/m: MeshTimeout/m/d, to be created with it: spec: ")))
		l, err = s.List(ctx, "", "")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l).To(BeEmpty())
	})
}

func TestConcurrentWritesCreateOnce(t *testing.T) {
	const writers = 20
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx := NewWithT(t), context.Background()
		// Two Stores on one database, as two replicas sharing it (for SQLite: two processes).
		stores := []Store{openStore(t, dsn), openStore(t, dsn)}
		defaults := []resource.Resource{policy("MeshTimeout", "m", "d1", `{}`), policy("MeshRetry", "m", "d2", `{}`)}

		start := make(chan struct{})
		results, errs := make(chan Result, writers), make(chan error, writers)
		var wg sync.WaitGroup
		for i := range writers {
			wg.Go(func() {
				<-start
				_, r, err := stores[i%2].Write(ctx, mesh("m"), defaults)
				if err != nil {
					errs <- err
					return
				}
				results <- r
			})
		}
		close(start)
		wg.Wait()
		close(results)
		close(errs)
		for err := range errs {
			g.Expect(err).NotTo(HaveOccurred())
		}
		counts := map[Result]int{}
		for r := range results {
			counts[r]++
		}
		g.Expect(counts).To(Equal(map[Result]int{Created: 1, Unchanged: writers - 1}))
		l, err := stores[0].List(ctx, "", "")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(keys(l)).To(Equal([]string{"Mesh/m", "MeshRetry/m/d2", "MeshTimeout/m/d1"}))
		g.Expect(revision(t, stores[0])).To(Equal(int64(1)))
	})
}

func TestResultString(t *testing.T) {
	g := NewWithT(t)
	g.Expect([]string{Created.String(), Updated.String(), Unchanged.String(), Result(9).String()}).
		To(Equal([]string{"created", "updated", "unchanged", "Result(9)"}))
}

// A batch is one transaction and one revision; an item the database refuses is reported in its
// outcome and the others are stored.
func TestWriteBatch(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)
		conflict := mesh("c")
		conflict.Generation = 7
		items := []WriteItem{
			{Resource: mesh("m"), OnCreate: []resource.Resource{policy("MeshTimeout", "m", "d", `{}`)}},
			{Resource: policy("MeshTimeout", "m", "a", `{}`)},
			{Resource: policy("MeshTimeout", "nope", "orphan", `{}`)},
			{Resource: conflict},
			{Resource: policy("MeshRetry", "m", "b", `{}`)},
		}
		out, err := s.WriteBatch(ctx, items)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(out).To(HaveLen(5))
		g.Expect(out[0].Result).To(Equal(Created))
		g.Expect(out[1].Result).To(Equal(Created))
		var mo *MissingOwnerError
		g.Expect(errors.As(out[2].Err, &mo)).To(BeTrue(), "%v", out[2].Err)
		g.Expect(out[3].Err).To(MatchError(ErrConflict))
		g.Expect(out[4].Result).To(Equal(Created))
		g.Expect(revision(t, s)).To(Equal(int64(1)), "one batch, one revision")
		l, err := s.List(ctx, "", "")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(keys(l)).To(Equal([]string{"Mesh/m", "MeshRetry/m/b", "MeshTimeout/m/a", "MeshTimeout/m/d"}))

		// Again: unchanged, no new revision; a changed one is updated.
		changed := policy("MeshTimeout", "m", "a", `{"v":2}`)
		out, err = s.WriteBatch(ctx, []WriteItem{{Resource: mesh("m")}, {Resource: changed}})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(out[0].Result).To(Equal(Unchanged))
		g.Expect(out[1].Result).To(Equal(Updated))
		g.Expect(out[1].Stored.Generation).To(Equal(int64(2)))
		g.Expect(revision(t, s)).To(Equal(int64(2)))
	})
}
