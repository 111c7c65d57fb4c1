package controlplane

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kds-host/kds-host/host/store"
)

// hangingStore is a store whose revision read hangs while hang is set: until its context ends
// when it honours deadlines, until released otherwise (a driver stuck in a system call).
type hangingStore struct {
	store.Store
	hang     atomic.Bool
	deadline bool
	release  chan struct{}
}

func (s *hangingStore) Revision(ctx context.Context) (int64, error) {
	if !s.hang.Load() {
		return 7, nil
	}
	if s.deadline {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	<-s.release
	return 7, nil
}

// A scrape and /readyz read the store probe's last answer and never wait on the store: while
// the store hangs they answer at once, with the last answer until the probe is past its 2 s
// deadline and with "does not answer" (kds_store_up 0) from then on, whether or not the store
// honours the deadline; once it answers again, so do they. The probe's goroutine ends with its
// context.
func TestScrapesReadTheStoreProbesLastAnswerAndNeverWait(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline bool
		wantErr  string
		wantAge  float64 // kds_store_probe_age_seconds 2.5 s into the hung probe
	}{
		{name: "a store that honours the deadline", deadline: true, wantErr: "the store does not answer: context deadline exceeded", wantAge: 0.5},
		{name: "a store stuck past it", deadline: false, wantErr: "its probe is still waiting (for 2.5s)", wantAge: 2.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := NewWithT(t)
				st := &hangingStore{deadline: tc.deadline, release: make(chan struct{})}
				p := newStoreProbe(st, time.Second)
				reg := prometheus.NewPedanticRegistry()
				reg.MustRegister(storeCollector{st: st, probe: p})
				diag := diagHandler(reg, p.ready, false)
				gauge := func(name string) float64 {
					mfs, err := reg.Gather()
					g.Expect(err).NotTo(HaveOccurred())
					for _, mf := range mfs {
						if mf.GetName() == name {
							return mf.GetMetric()[0].GetGauge().GetValue()
						}
					}
					return -1
				}
				up := func() float64 { return gauge("kds_store_up") }
				readyz := func() (int, string) {
					rec := httptest.NewRecorder()
					diag.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
					return rec.Code, rec.Body.String()
				}
				g.Expect(up()).To(Equal(-1.0), "absent before the first probe")
				code, body := readyz()
				g.Expect(code).To(Equal(http.StatusServiceUnavailable))
				g.Expect(body).To(ContainSubstring("has not answered its first probe"))

				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan struct{})
				go func() {
					defer close(done)
					p.run(ctx)
				}()
				synctest.Wait()
				g.Expect(up()).To(Equal(1.0))
				code, body = readyz()
				g.Expect(code).To(Equal(http.StatusOK))
				g.Expect(body).To(Equal("ok: store probed 0s ago\n"))

				st.hang.Store(true)
				time.Sleep(time.Second) // the next probe begins, and hangs
				synctest.Wait()
				g.Expect(up()).To(Equal(1.0), "within the deadline, the last answer")
				time.Sleep(1500 * time.Millisecond)
				synctest.Wait()
				g.Expect(up()).To(Equal(1.0), "1.5 s into the probe")
				time.Sleep(time.Second)
				synctest.Wait()
				g.Expect(up()).To(Equal(0.0), "past the 2 s deadline")
				g.Expect(gauge("kds_store_probe_age_seconds")).To(BeNumerically("~", tc.wantAge, 0.001))
				code, body = readyz()
				g.Expect(code).To(Equal(http.StatusServiceUnavailable))
				g.Expect(body).To(ContainSubstring(tc.wantErr))

				st.hang.Store(false)
				close(st.release)
				time.Sleep(time.Second)
				synctest.Wait()
				g.Expect(up()).To(Equal(1.0), "answering again")
				code, _ = readyz()
				g.Expect(code).To(Equal(http.StatusOK))

				cancel()
				<-done
			})
		})
	}
}
