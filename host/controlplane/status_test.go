package controlplane_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"golang.org/x/net/websocket"

	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
	"github.com/kds-host/kds-host/policy"
)

// startGlobalWithPlugins runs a global, as startGlobal does, that serves /api/plugins of a
// plugin runtime running the built-in policy, as kds-host does.
func startGlobalWithPlugins(t testing.TB, reg *resource.Registry, seed ...resource.Resource) *controlplane.Global {
	t.Helper()
	gst := openSQLite(t)
	for _, r := range seed {
		put(t, gst, reg, r)
	}
	rt := startRuntime(t, policy.Spec{Path: policy.Builtin})
	cfg := controlplane.GlobalConfig{
		Store: gst, Registry: reg, KDSAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0", DiagAddr: "127.0.0.1:0",
		Logger: logger(t, "global"), Builtin: retrypolicy.New(), PollInterval: 50 * time.Millisecond,
		Keys: testKeys(), KDSAuth: true,
	}
	cfg.UsePlugins(rt)
	g, err := controlplane.NewGlobal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g.ServePlugins(rt, func() (policy.Plugins, error) {
		return policy.Plugins{List: []policy.Spec{{Path: policy.Builtin}}}, nil
	}, "")
	runUntilStopped(t, "global", g.Run)
	return g
}

// TestTheStatusPageIsOpenAndItsDataIsNot checks the rule of access: the page's own files are
// served without a token, with a Content-Security-Policy; its data calls need one; a browser
// asking for / is sent to the page, any other client still gets JSON.
func TestTheStatusPageIsOpenAndItsDataIsNot(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gl := startGlobal(t, openSQLite(t), reg)
	z := startZone(t, "zone-1", gl.KDSAddr(), openSQLite(t), reg)
	client := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(url, accept, tok string) (*http.Response, string) {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		g.Expect(err).NotTo(HaveOccurred())
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := client.Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	for _, base := range []string{"http://" + gl.APIAddr(), "http://" + z.APIAddr()} {
		for _, path := range []string{"/gui", "/gui/", "/gui/status.css", "/gui/common.js", "/gui/config.json"} {
			resp, body := get(base+path, "", "")
			g.Expect(resp.StatusCode).To(Equal(http.StatusOK), "%s%s: %s", base, path, body)
			csp := resp.Header.Get("Content-Security-Policy")
			g.Expect(csp).To(ContainSubstring("script-src 'self'"), path)
			g.Expect(csp).To(ContainSubstring("connect-src 'self'"), path)
			g.Expect(csp).NotTo(ContainSubstring("unsafe-inline"), path)
			g.Expect(resp.Header.Get("X-Content-Type-Options")).To(Equal("nosniff"))
		}
		resp, body := get(base+"/gui", "", "")
		g.Expect(resp.Header.Get("Content-Type")).To(HavePrefix("text/html"))
		g.Expect(body).NotTo(MatchRegexp(`<script>|<script [^>]*>[^<]`), "no inline script")
		g.Expect(body).NotTo(ContainSubstring("style="), "no inline style")
		// Everything shown is set as text: no markup parsing, no code from strings, and the
		// one fetch is common.js's, which takes paths of this origin only.
		for _, js := range []string{"common.js", "global.js", "zone.js"} {
			_, body := get(base+"/gui/"+js, "", "")
			for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(", "style="} {
				g.Expect(body).NotTo(ContainSubstring(bad), js)
			}
			if js != "common.js" {
				g.Expect(body).NotTo(ContainSubstring("fetch("), js)
			}
		}
		resp, _ = get(base+"/gui/nosuch.js", "", "")
		g.Expect(resp.StatusCode).To(Equal(http.StatusNotFound))
		resp, _ = get(base+"/gui/../access.go", "", "")
		g.Expect(resp.StatusCode).NotTo(Equal(http.StatusOK))

		resp, _ = get(base+"/", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", "")
		g.Expect(resp.StatusCode).To(Equal(http.StatusSeeOther))
		g.Expect(resp.Header.Get("Location")).To(Equal("/gui"))
		for _, accept := range []string{"", "*/*", "application/json"} {
			resp, body = get(base+"/", accept, "")
			g.Expect(resp.StatusCode).To(Equal(http.StatusOK), "Accept %q", accept)
			g.Expect(body).To(ContainSubstring(`"product"`), "Accept %q", accept)
		}
	}
	_, conf := get("http://"+gl.APIAddr()+"/gui/config.json", "", "")
	g.Expect(conf).To(ContainSubstring(`"mode":"global"`))
	g.Expect(conf).To(ContainSubstring(`"auth":true`))
	_, conf = get("http://"+z.APIAddr()+"/gui/config.json", "", "")
	g.Expect(conf).To(ContainSubstring(`"mode":"zone"`))
	g.Expect(conf).To(ContainSubstring(`"auth":false`))

	readOnly := token(t, auth.Claims{Kind: auth.KindUser, Name: "viewer", Groups: []string{auth.GroupReadOnly}})
	for _, path := range []string{"/api/zones", "/api/timeline"} {
		resp, _ := get("http://"+gl.APIAddr()+path, "", "")
		g.Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized), path)
		resp, body := get("http://"+gl.APIAddr()+path, "", readOnly)
		g.Expect(resp.StatusCode).To(Equal(http.StatusOK), "%s: %s", path, body)
	}
	g.Eventually(func() string {
		_, body := get("http://"+gl.APIAddr()+"/api/timeline?zone=zone-1", "", readOnly)
		return body
	}, 10*time.Second).Should(MatchRegexp(`"type": *"connected"`))
}

// TestTheStatusPageShowsAFailingZoneLive opens the global's status page in headless Chromium
// while a zone NACKs Mesh, signs in with a read-only token through the page's form, and checks
// that the page shows the zone, the failing kind, a live retry countdown and the NACKs on the
// timeline, that a zone connecting later appears without a reload, and that the zone's own
// page shows what it refused. Any console error (a script error, a refused request, a
// Content-Security-Policy violation) fails it. Screenshots are saved in the test's temp dir
// (and in $KDS_TEST_SCREENSHOTS, when set).
func TestTheStatusPageShowsAFailingZoneLive(t *testing.T) {
	g := NewWithT(t)
	browser := startChromium(t)

	reg := resource.Default()
	seed := append([]resource.Resource{mesh("default")}, resource.MeshDefaults("default")...)
	gl := startGlobalWithPlugins(t, reg, seed...)
	z1 := startZone(t, "zone-1", gl.KDSAddr(), openSQLite(t), reg, func(c *zone.Config) {
		c.AdmissionOutage = map[string]time.Duration{"Mesh": time.Hour}
	})
	g.Eventually(func() int { return len(kindInsight(gl, "zone-1", "Mesh").Rejected) }, patience).Should(Equal(1))

	page := browser.open(t)
	// A browser asking for / is sent to /gui; the page asks for the token first.
	page.navigate(t, "http://"+gl.APIAddr()+"/")
	page.waitFor(t, `document.location.pathname === "/gui" && !document.getElementById("login").hidden`)
	g.Expect(page.eval(t, `document.getElementById("login-hint").textContent`)).To(And(ContainSubstring("<data-dir>/admin.token"), Not(ContainSubstring("/tmp"))),
		"no path of this machine in an answer that needs no token")
	readOnly := token(t, auth.Claims{Kind: auth.KindUser, Name: "viewer", Groups: []string{auth.GroupReadOnly}})
	tok, _ := json.Marshal(readOnly)
	page.eval(t, fmt.Sprintf(`document.getElementById("token").value = %s; document.getElementById("login-form").requestSubmit(); true`, tok))

	zoneSel := `document.querySelector('section.zone[data-zone="zone-1"]')`
	page.waitFor(t, zoneSel+` !== null`)
	page.waitFor(t, zoneSel+`.querySelector('tr.kind.failing[data-kind="Mesh"]') !== null`)
	g.Expect(page.eval(t, zoneSel+`.querySelector("table.kinds thead").textContent`)).To(ContainSubstring("withheld"))
	page.waitFor(t, `[...document.querySelectorAll('tr.rejected[data-kind="Mesh"]')].some(r => r.textContent.includes("TRANSIENT"))`)
	page.waitFor(t, `/^in \d/.test((`+zoneSel+`.querySelector(".retry .countdown") || {}).textContent || "")`)
	first := page.eval(t, zoneSel+`.querySelector(".retry .countdown").textContent`)
	// Live: the countdown moves between polls, and the chart shows the NACKs and rounds.
	page.waitFor(t, fmt.Sprintf(`(%s.querySelector(".retry .countdown") || {}).textContent !== %q`, zoneSel, first))
	page.waitFor(t, zoneSel+`.querySelectorAll("svg.chart circle.nack").length >= 2`)
	page.waitFor(t, zoneSel+`.querySelectorAll("svg.chart rect.round").length >= 1`)
	page.waitFor(t, `document.querySelector('#plugins tr.plugin[data-plugin="builtin"]') !== null`)
	g.Expect(page.eval(t, `sessionStorage.getItem("kds-host.token") !== null`)).To(Equal("true"))

	// Durations as a person reads them, not as Go writes them ("last delay 1.120755978s",
	// "41.012µs / 3.632167ms"): 3 significant digits at most, a unit after a no-break space.
	const oneDuration = `(\d{1,3}|\d\.\d{1,2}|\d\d\.\d) (ns|µs|ms|s)|\d+ min( \d+ s)?|\d+ h( \d+ min)?`
	page.waitFor(t, `/last delay/.test(`+zoneSel+`.querySelector(".retry").textContent)`)
	g.Expect(page.text(t, zoneSel+`.querySelector(".retry p")`)).To(MatchRegexp(`· last delay (%s)$`, oneDuration))
	builtin := `document.querySelector('#plugins tr.plugin[data-plugin="builtin"]')`
	page.waitFor(t, builtin+`.querySelector(".latency").textContent !== "-"`)
	g.Expect(page.text(t, builtin+`.querySelector(".latency")`)).To(MatchRegexp(`^(%[1]s) / (%[1]s) / (%[1]s)$`, oneDuration))
	g.Expect(page.text(t, zoneSel+`.querySelector("svg.chart rect.round title")`)).To(MatchRegexp(`round \d+ after (%s): resent`, oneDuration))
	g.Expect(page.text(t, zoneSel+`.querySelector(".retry .countdown")`)).To(Or(Equal("due now"), MatchRegexp(`^in (%s)$`, oneDuration)))
	g.Expect(page.text(t, `document.getElementById("status")`)).To(HaveSuffix("every 1 s"))

	// A zone that connects now appears without a reload.
	polls := page.eval(t, `document.body.getAttribute("data-polls")`)
	z2 := startZone(t, "zone-2", gl.KDSAddr(), openSQLite(t), reg)
	page.waitFor(t, `document.querySelector('section.zone[data-zone="zone-2"] .badge.ok') !== null`)
	g.Expect(page.eval(t, `Number(document.body.getAttribute("data-polls")) > `+polls)).To(Equal("true"))
	g.Expect(page.wordsBrokenInside(t, 640)).To(BeEmpty(), "words wrapped inside themselves at 640 px")
	page.screenshot(t, "global.png")

	// The zones' own pages: what zone-1 refused, what zone-2 has ACKed.
	page.navigate(t, "http://"+z1.APIAddr()+"/gui")
	page.waitFor(t, `document.querySelector('#refused tr.kind.failing[data-kind="Mesh"]') !== null`)
	page.waitFor(t, `document.querySelector('#acked tr.kind[data-kind="MeshTimeout"]') !== null`)
	g.Expect(page.eval(t, `document.querySelector("#connection .badge").textContent`)).To(Equal("connected"))
	g.Expect(page.wordsBrokenInside(t, 480)).To(BeEmpty(), "words wrapped inside themselves at 480 px")
	page.screenshot(t, "zone-1.png")
	page.navigate(t, "http://"+z2.APIAddr()+"/gui")
	page.waitFor(t, `(document.querySelector('#acked tr.kind[data-kind="MeshTimeout"]') || {}).textContent?.includes("default/mesh-timeout-all-default")`)
	g.Expect(page.eval(t, `document.querySelector("#refused").textContent`)).To(ContainSubstring("Nothing refused"))
	page.screenshot(t, "zone-2.png")

	g.Expect(page.consoleErrors()).To(BeEmpty(), "console errors")
}

// TestTheStatusPageShowsWhatIsWithheldAndParked opens the global's status page with owner holds
// on: zone-1 refuses Mesh, so the global withholds its policies (WAIT); zone-2 refuses one
// MeshTimeout as INVALID until the retry policy parks it. The page shows each under its own
// word: "withheld" in the kinds table and the owner holds block, "parked" in the names.
func TestTheStatusPageShowsWhatIsWithheldAndParked(t *testing.T) {
	g := NewWithT(t)
	browser := startChromium(t)

	reg := resource.Default()
	gst := openSQLite(t)
	seedMesh(t, gst, reg)
	gl := startGlobal(t, gst, reg, withHolds, func(c *controlplane.GlobalConfig) {
		c.Builtin = policyOf(t, "policy: fixed\ndelay: 20ms\ninvalidAttempts: 3\n")
	})
	startZone(t, "zone-1", gl.KDSAddr(), openSQLite(t), reg, func(c *zone.Config) {
		c.AdmissionOutage = map[string]time.Duration{"Mesh": time.Hour}
	})
	startZone(t, "zone-2", gl.KDSAddr(), openSQLite(t), reg, func(c *zone.Config) {
		c.AdmissionDeny = map[string]string{"deny": "true"}
	})
	bad := timeout("default", "bad", "3s")
	bad.Labels = map[string]string{"deny": "true"}
	put(t, gst, reg, bad)

	page := browser.open(t)
	page.navigate(t, "http://"+gl.APIAddr()+"/gui")
	page.waitFor(t, `!document.getElementById("login").hidden`)
	readOnly := token(t, auth.Claims{Kind: auth.KindUser, Name: "viewer", Groups: []string{auth.GroupReadOnly}})
	tok, _ := json.Marshal(readOnly)
	page.eval(t, fmt.Sprintf(`document.getElementById("login-form").querySelector("#token").value = %s; document.getElementById("login-form").requestSubmit(); true`, tok))

	zone1 := `document.querySelector('section.zone[data-zone="zone-1"]')`
	page.waitFor(t, `(`+zone1+` || document.body).querySelector("table.withheld") !== null`)
	g.Expect(page.eval(t, zone1+`.textContent`)).To(ContainSubstring("Withheld by owner holds"))
	g.Expect(page.eval(t, zone1+`.querySelector("table.withheld tbody").textContent`)).To(ContainSubstring("WAIT"))
	g.Expect(page.eval(t, zone1+`.querySelector("table.kinds thead").textContent`)).To(ContainSubstring("withheld"))
	// The MeshTimeout row counts what is withheld of the kind: the defaults and the bad one.
	page.waitFor(t, `Number(`+zone1+`.querySelector('tr.kind[data-kind="MeshTimeout"] td:nth-child(6)').textContent) > 0`)

	zone2 := `document.querySelector('section.zone[data-zone="zone-2"]')`
	page.waitFor(t, `(`+zone2+` || document.body).querySelector('tr.parked-name[data-kind="MeshTimeout"]') !== null`)
	row := page.eval(t, zone2+`.querySelector('tr.parked-name[data-kind="MeshTimeout"]').textContent`)
	g.Expect(row).To(ContainSubstring("default/bad"))
	g.Expect(row).To(ContainSubstring("parked"))
	g.Expect(row).To(ContainSubstring("invalid 3 times"))
	g.Expect(page.eval(t, zone2+`.textContent`)).To(ContainSubstring("Rejected and parked names"))
	// Every failing name of zone-2 is parked: no round is decided, and the page says why, not
	// "deciding" for as long as it stays so.
	page.waitFor(t, `(document.querySelector('tr.zone-row[data-zone="zone-2"] .pending') || {}).textContent === "parked: 1 name"`)
	g.Expect(page.text(t, zone2+`.querySelector(".retry .pending")`)).To(Equal("parked: 1 name held by the retry policy (each name's reason below); no round pending"))
	g.Expect(page.text(t, zone2+`.querySelector("table.failing-kinds tbody td:nth-child(4)")`)).To(Equal("none (1 parked: not resent)"))
	g.Expect(page.text(t, zone2)).NotTo(ContainSubstring("deciding"))

	// Names, causes and reasons wrap between words, even on a narrow screen: the kinds' last
	// errors, the rejected names' reasons, the withheld resources.
	g.Expect(page.wordsBrokenInside(t, 640)).To(BeEmpty(), "words wrapped inside themselves at 640 px")
	g.Expect(page.wordsBrokenInside(t, 1000)).To(BeEmpty(), "words wrapped inside themselves at 1000 px")
	page.screenshot(t, "withheld-and-parked.png")
	// This global runs no plugin runtime, so it serves no /api/plugins: the one error allowed.
	g.Expect(page.consoleErrors()).To(HaveEach(ContainSubstring("/api/plugins")), "console errors")
}

// TestTheStatusPageSaysWhatIsWithheldInsteadOfDeciding: the zone refuses a MeshTimeout as
// INVALID and the retry policy keeps resending it; then it is changed to name an owner that
// exists nowhere, so owner holds withhold the new version (REJECT), and the refused one is no
// round's to resend. Every failing name is withheld: the page says so where it said "deciding"
// for as long as that lasted.
func TestTheStatusPageSaysWhatIsWithheldInsteadOfDeciding(t *testing.T) {
	g := NewWithT(t)
	browser := startChromium(t)

	reg := resource.Default()
	gst := openSQLite(t)
	seedMesh(t, gst, reg)
	gl := startGlobal(t, gst, reg, withHolds, func(c *controlplane.GlobalConfig) {
		c.Builtin = policyOf(t, "policy: fixed\ndelay: 100ms\ninvalidAttempts: 1000\n")
	})
	startZone(t, "zone-1", gl.KDSAddr(), openSQLite(t), reg, func(c *zone.Config) {
		c.AdmissionDeny = map[string]string{"deny": "true"}
	})
	bad := timeout("default", "bad", "3s")
	bad.Labels = map[string]string{"deny": "true"}
	put(t, gst, reg, bad)
	g.Eventually(func() int { return len(kindInsight(gl.Global, "zone-1", "MeshTimeout").Rejected) }, patience).Should(Equal(1))
	bad.Owners = []resource.Key{{Kind: "MeshRetry", Mesh: "default", Name: "nowhere"}}
	put(t, gst, reg, bad)
	g.Eventually(func() map[string][]string {
		return gl.ZoneViews()[0].RetryWithheld
	}, patience).Should(Equal(map[string][]string{"MeshTimeout": {"default/bad"}}))

	page := browser.open(t)
	page.navigate(t, "http://"+gl.APIAddr()+"/gui")
	page.waitFor(t, `!document.getElementById("login").hidden`)
	readOnly := token(t, auth.Claims{Kind: auth.KindUser, Name: "viewer", Groups: []string{auth.GroupReadOnly}})
	page.eval(t, fmt.Sprintf(`document.getElementById("token").value = %s; document.getElementById("login-form").requestSubmit(); true`, mustJSON(t, readOnly)))

	zone1 := `document.querySelector('section.zone[data-zone="zone-1"]')`
	page.waitFor(t, `(document.querySelector('tr.zone-row[data-zone="zone-1"] .pending') || {}).textContent === "withheld: 1 name"`)
	g.Expect(page.text(t, zone1+`.querySelector(".retry .pending")`)).To(Equal("withheld: 1 name held by owner holds until they let it go; no round pending"))
	g.Expect(page.text(t, zone1+`.querySelector('tr.rejected.withheld-name[data-kind="MeshTimeout"]')`)).To(
		And(ContainSubstring("default/bad"), ContainSubstring("INVALID"), ContainSubstring("withheld")))
	g.Expect(page.text(t, zone1+`.querySelector("table.failing-kinds tbody td:nth-child(4)")`)).To(Equal("none (1 withheld: not resent)"))
	g.Expect(page.text(t, zone1+`.querySelector("table.withheld tbody")`)).To(ContainSubstring("REJECT"))
	g.Expect(page.text(t, `document.body`)).NotTo(ContainSubstring("deciding"))
	page.screenshot(t, "withheld-instead-of-deciding.png")
	g.Expect(page.consoleErrors()).To(HaveEach(ContainSubstring("/api/plugins")), "console errors")
}

// TestTheStatusPagesFormatForPeople runs the pages' formatting (common.js) in Chromium, where
// the pages run it: every duration they show goes through duration (3 significant digits at
// most, the unit chosen by magnitude, never split over two lines), the API's Go durations
// ("1.120755978s") through goDuration, and names through name, which lets them wrap after
// their separators and breaks inside only a run too long to wrap otherwise.
func TestTheStatusPagesFormatForPeople(t *testing.T) {
	g := NewWithT(t)
	browser := startChromium(t)
	gl := startGlobal(t, openSQLite(t), resource.Default())
	page := browser.open(t)
	page.navigate(t, "http://"+gl.APIAddr()+"/gui")
	page.waitFor(t, `document.readyState === "complete"`)
	// call runs common.js's function fn on each input (JSON) and returns its results as JSON.
	call := func(fn string, inputs any, out any) {
		t.Helper()
		in, err := json.Marshal(inputs)
		g.Expect(err).NotTo(HaveOccurred())
		res := page.eval(t, fmt.Sprintf(`import("/gui/common.js").then((m) => JSON.stringify(%s.map((x) => {
			const v = m.%s(x);
			return typeof v === "number" && Number.isNaN(v) ? "NaN" : v;
		})))`, in, fn))
		g.Expect(json.Unmarshal([]byte(res), out)).To(Succeed(), res)
	}

	t.Run("duration", func(t *testing.T) {
		g := NewWithT(t)
		cases := []struct {
			ms   float64
			want string
		}{
			{0, "0 s"}, {-5, "0 s"},
			{850e-6, "850 ns"}, {1e-6, "1 ns"},
			{0.041012, "41 µs"}, {0.0123456, "12.3 µs"}, {0.9994, "999 µs"}, {0.9999, "1 ms"},
			{3.632167, "3.63 ms"}, {850, "850 ms"}, {999.6, "1 s"},
			{1120.755978, "1.12 s"}, {4200, "4.2 s"}, {10000, "10 s"}, {59940, "59.9 s"},
			{59960, "1 min"}, {60000, "1 min"}, {125000, "2 min 5 s"}, {3599400, "59 min 59 s"},
			{3599600, "1 h"}, {3720000, "1 h 2 min"}, {86399000, "1 d"}, {90000000, "1 d 1 h"},
		}
		var in []float64
		for _, c := range cases {
			in = append(in, c.ms)
		}
		var got []string
		call("duration", in, &got)
		g.Expect(got).To(HaveLen(len(cases)))
		for i, c := range cases {
			g.Expect(got[i]).NotTo(ContainSubstring(" "), "a duration is joined by no-break spaces: %v ms", c.ms)
			g.Expect(strings.ReplaceAll(got[i], "\u00a0", " ")).To(Equal(c.want), "%v ms", c.ms)
		}
	})

	t.Run("goDuration", func(t *testing.T) {
		g := NewWithT(t)
		cases := []struct {
			in   string
			want any // milliseconds, or "NaN"
		}{
			{"1.120755978s", 1120.755978}, {"41.012µs", 0.041012}, {"41.012\u03bcs", 0.041012}, {"5us", 0.005},
			{"3.632167ms", 3.632167}, {"500ns", 0.0005}, {"2m0s", 120000.0}, {"1h2m3.5s", 3723500.0},
			{"1.5h", 5400000.0}, {".5s", 500.0}, {"1.s", 1000.0}, {"0s", 0.0}, {"0", 0.0}, {"+2s", 2000.0}, {"-1.5s", -1500.0},
			{"", "NaN"}, {"-", "NaN"}, {"1", "NaN"}, {"00", "NaN"}, {"s", "NaN"}, {".s", "NaN"}, {"1x", "NaN"},
			{"1.2.3s", "NaN"}, {"1s ", "NaN"}, {" 1s", "NaN"}, {"1 s", "NaN"}, {"1S", "NaN"}, {"soon", "NaN"},
		}
		var in []string
		for _, c := range cases {
			in = append(in, c.in)
		}
		var got []any
		call("goDuration", in, &got)
		g.Expect(got).To(HaveLen(len(cases)))
		for i, c := range cases {
			if want, ok := c.want.(float64); ok {
				g.Expect(got[i]).To(BeNumerically("~", want, 1e-9), "%q", c.in)
			} else {
				g.Expect(got[i]).To(Equal(c.want), "%q", c.in)
			}
		}
		var text []string
		call("goDurationText", []any{"1.120755978s", "41.012µs", "3.632167ms", "2m5s", "1h2m0s", "soon", nil}, &text)
		for i := range text {
			text[i] = strings.ReplaceAll(text[i], "\u00a0", " ")
		}
		g.Expect(text).To(Equal([]string{"1.12 s", "41 µs", "3.63 ms", "2 min 5 s", "1 h 2 min", "soon", ""}))
	})

	t.Run("name", func(t *testing.T) {
		g := NewWithT(t)
		long := strings.Repeat("a", 33)
		in := []string{"zone-1", "default/mesh-timeout-all-default", "grpc://127.0.0.1:5685", "1.12 s at 12:00:01",
			"MISSING_OWNER", strings.Repeat("a", 32), long, "Mesh/" + long + "/x"}
		res := page.eval(t, fmt.Sprintf(`import("/gui/common.js").then((m) => JSON.stringify(%s.map((x) => {
			const e = m.name(x);
			return {text: e.textContent, wbr: e.querySelectorAll("wbr").length, long: [...e.querySelectorAll(".long-token")].map((l) => l.textContent)};
		})))`, mustJSON(t, in)))
		type shown struct {
			Text string
			WBR  int
			Long []string
		}
		var got []shown
		g.Expect(json.Unmarshal([]byte(res), &got)).To(Succeed(), res)
		g.Expect(got).To(Equal([]shown{
			{Text: in[0], Long: []string{}},
			{Text: in[1], WBR: 1, Long: []string{}},     // after the mesh's slash; hyphens wrap by themselves
			{Text: in[2], WBR: 3, Long: []string{}},     // after "grpc:" and its slashes; none inside the address
			{Text: in[3], WBR: 0, Long: []string{}},     // no break inside a number or a time
			{Text: in[4], WBR: 1, Long: []string{}},     // after the underscore
			{Text: in[5], WBR: 0, Long: []string{}},     // 32 characters: not long
			{Text: in[6], WBR: 0, Long: []string{long}}, // 33: may break anywhere
			{Text: in[7], WBR: 2, Long: []string{long}}, // only the long run
		}))
	})
	g.Expect(page.consoleErrors()).To(BeEmpty(), "console errors")
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// chromium is a headless Chromium this test started, driven over its DevTools protocol.
type chromium struct {
	port int
}

// startChromium starts headless Chromium until the test ends. Without one the test fails
// under CI=true (CI installs it: scripts/setup-test-deps.sh) and is skipped elsewhere.
func startChromium(t *testing.T) *chromium {
	t.Helper()
	bin := os.Getenv("KDS_CHROMIUM")
	if bin == "" {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
			if p, err := exec.LookPath(name); err == nil {
				bin = p
				break
			}
		}
	}
	if bin == "" {
		const msg = "headless Chromium is needed for the status page test: apt-get install -y chromium (scripts/setup-test-deps.sh installs it), or set KDS_CHROMIUM"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	args := []string{"--headless=new", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
		"--remote-allow-origins=http://127.0.0.1", "--user-data-dir=" + filepath.Join(dir, "profile"),
		"--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-dev-shm-usage",
		"--disable-extensions", "--disable-background-networking", "--disable-sync", "--disable-component-update",
		"--mute-audio", "--hide-scrollbars", "--window-size=1280,1800",
		// Its sandbox refuses root, and needs user namespaces a container may not grant; the
		// browser loads nothing but this test's own pages on loopback.
		"--no-sandbox", "about:blank"}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	logFile, err := os.Create(filepath.Join(dir, "chromium.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logFile.Close(); close(exited) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) // its own process group: the browser and its helpers
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
	// Chromium writes the port it chose into DevToolsActivePort.
	deadline := time.Now().Add(patience)
	for {
		b, err := os.ReadFile(filepath.Join(dir, "profile", "DevToolsActivePort"))
		if err == nil {
			if port, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0]); err == nil && port > 0 {
				return &chromium{port: port}
			}
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "chromium.log"))
			t.Fatalf("%s exited before it served DevTools:\n%s", bin, log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not write DevToolsActivePort within %s", bin, patience)
		}
	}
}

// open opens a new tab and attaches to it.
func (c *chromium) open(t *testing.T) *tab {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("http://127.0.0.1:%d/json/new?about:blank", c.port), nil)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var target struct {
		ID, WebSocketDebuggerURL string
	}
	if err := json.NewDecoder(resp.Body).Decode(&target); err != nil || target.WebSocketDebuggerURL == "" {
		t.Fatalf("DevTools /json/new: %v (status %s)", err, resp.Status)
	}
	ws, err := websocket.Dial(target.WebSocketDebuggerURL, "", "http://127.0.0.1")
	if err != nil {
		t.Fatalf("DevTools websocket: %v", err)
	}
	p := &tab{ws: ws, pending: map[int64]chan cdpReply{}, done: make(chan struct{})}
	go p.read()
	t.Cleanup(p.close)
	for _, m := range []string{"Runtime.enable", "Log.enable", "Page.enable"} {
		p.call(t, m, nil, nil)
	}
	p.call(t, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1280, "height": 1800, "deviceScaleFactor": 1, "mobile": false}, nil)
	return p
}

// tab is one page of the browser: a minimal DevTools protocol client (commands and their
// replies by id; events read for console errors).
type tab struct {
	ws      *websocket.Conn
	mu      sync.Mutex
	next    int64
	pending map[int64]chan cdpReply
	errs    []string
	done    chan struct{}
	once    sync.Once
}

type cdpReply struct {
	Result json.RawMessage
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
}

type cdpMessage struct {
	ID     int64           `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	cdpReply
}

func (p *tab) read() {
	defer close(p.done)
	for {
		var m cdpMessage
		if err := websocket.JSON.Receive(p.ws, &m); err != nil {
			return
		}
		if m.ID != 0 {
			p.mu.Lock()
			ch := p.pending[m.ID]
			delete(p.pending, m.ID)
			p.mu.Unlock()
			if ch != nil {
				ch <- m.cdpReply
			}
			continue
		}
		if e := consoleError(m.Method, m.Params); e != "" {
			p.mu.Lock()
			p.errs = append(p.errs, e)
			p.mu.Unlock()
		}
	}
}

// consoleError is what an event says went wrong on the page, or "".
func consoleError(method string, params json.RawMessage) string {
	switch method {
	case "Runtime.consoleAPICalled":
		var ev struct {
			Type string `json:"type"`
			Args []struct {
				Value       any    `json:"value"`
				Description string `json:"description"`
			} `json:"args"`
		}
		if json.Unmarshal(params, &ev) != nil || ev.Type != "error" && ev.Type != "assert" {
			return ""
		}
		var parts []string
		for _, a := range ev.Args {
			parts = append(parts, fmt.Sprint(a.Value, a.Description))
		}
		return "console." + ev.Type + ": " + strings.Join(parts, " ")
	case "Runtime.exceptionThrown":
		var ev struct {
			ExceptionDetails struct {
				Text      string `json:"text"`
				URL       string `json:"url"`
				Line      int    `json:"lineNumber"`
				Exception struct {
					Description string `json:"description"`
				} `json:"exception"`
			} `json:"exceptionDetails"`
		}
		json.Unmarshal(params, &ev)
		d := ev.ExceptionDetails
		return fmt.Sprintf("exception at %s:%d: %s %s", d.URL, d.Line, d.Text, d.Exception.Description)
	case "Log.entryAdded": // failed requests, CSP violations, the browser's own errors
		var ev struct {
			Entry struct {
				Level, Source, Text, URL string
			} `json:"entry"`
		}
		if json.Unmarshal(params, &ev) != nil || ev.Entry.Level != "error" {
			return ""
		}
		return fmt.Sprintf("%s: %s (%s)", ev.Entry.Source, ev.Entry.Text, ev.Entry.URL)
	}
	return ""
}

func (p *tab) close() {
	p.once.Do(func() { p.ws.Close() })
	<-p.done
}

func (p *tab) consoleErrors() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.errs...)
}

// call sends a command and decodes its result into result (if not nil).
func (p *tab) call(t *testing.T, method string, params, result any) {
	t.Helper()
	if err := p.try(method, params, result); err != nil {
		t.Fatal(err)
	}
}

func (p *tab) try(method string, params, result any) error {
	ch := make(chan cdpReply, 1)
	p.mu.Lock()
	p.next++
	id := p.next
	p.pending[id] = ch
	p.mu.Unlock()
	if params == nil {
		params = map[string]any{}
	}
	if err := websocket.JSON.Send(p.ws, map[string]any{"id": id, "method": method, "params": params}); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	select {
	case r := <-ch:
		if r.Error != nil {
			return fmt.Errorf("%s: %s (%d)", method, r.Error.Message, r.Error.Code)
		}
		if result != nil {
			return json.Unmarshal(r.Result, result)
		}
		return nil
	case <-p.done:
		return fmt.Errorf("%s: the DevTools connection closed", method)
	case <-time.After(patience):
		return fmt.Errorf("%s: no answer within %s", method, patience)
	}
}

func (p *tab) navigate(t *testing.T, url string) {
	t.Helper()
	var r struct {
		ErrorText string `json:"errorText"`
	}
	p.call(t, "Page.navigate", map[string]any{"url": url}, &r)
	if r.ErrorText != "" {
		t.Fatalf("navigate to %s: %s", url, r.ErrorText)
	}
}

// eval evaluates a JavaScript expression in the page and returns its value as text (a promise's,
// once it settles).
func (p *tab) eval(t *testing.T, expr string) string {
	t.Helper()
	v, err := p.evaluate(expr)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func (p *tab) evaluate(expr string) (string, error) {
	var r struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text string `json:"text"`
		} `json:"exceptionDetails"`
	}
	if err := p.try("Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &r); err != nil {
		return "", err
	}
	if r.ExceptionDetails != nil {
		return "", fmt.Errorf("evaluate %s: %s", expr, r.ExceptionDetails.Text)
	}
	return fmt.Sprint(r.Result.Value), nil
}

// text is the text of the element expr finds, as a person reads it: no-break spaces as spaces.
func (p *tab) text(t *testing.T, expr string) string {
	t.Helper()
	return strings.ReplaceAll(p.eval(t, `(`+expr+`).textContent`), "\u00a0", " ")
}

// wordsBrokenInside lists the words (runs of letters and digits) of the page's table cells and
// paragraphs that wrap inside themselves at a width of the page (in CSS pixels), except in a run
// too long to wrap otherwise (.long-token). A name may wrap after a hyphen or a separator: that
// is between two words.
func (p *tab) wordsBrokenInside(t *testing.T, width int) []string {
	t.Helper()
	p.call(t, "Emulation.setDeviceMetricsOverride", map[string]any{"width": width, "height": 1800, "deviceScaleFactor": 1, "mobile": false}, nil)
	defer p.call(t, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1280, "height": 1800, "deviceScaleFactor": 1, "mobile": false}, nil)
	res := p.eval(t, `new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(() => {
		const broken = [];
		for (const box of document.querySelectorAll("td, main p")) {
			const walk = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
			for (let n = walk.nextNode(); n; n = walk.nextNode()) {
				if (n.parentElement.closest(".long-token")) continue;
				for (const m of n.data.matchAll(/[\p{L}\p{N}]+/gu)) {
					const r = document.createRange();
					r.setStart(n, m.index);
					r.setEnd(n, m.index + m[0].length);
					const lines = new Set([...r.getClientRects()].map((q) => Math.round(q.top)));
					if (lines.size > 1) broken.push(m[0]);
				}
			}
		}
		done(JSON.stringify(broken));
	})))`)
	var broken []string
	if err := json.Unmarshal([]byte(res), &broken); err != nil {
		t.Fatalf("%v: %s", err, res)
	}
	return broken
}

// waitFor waits until a JavaScript condition holds in the page; on a timeout it fails with the
// page's text, so the failure shows what the page did show.
func (p *tab) waitFor(t *testing.T, cond string) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		v, err := p.evaluate("Boolean(" + cond + ")")
		if err == nil && v == "true" {
			return
		}
		if time.Now().After(deadline) {
			text, _ := p.evaluate(`document.body ? document.body.innerText : ""`)
			t.Fatalf("the page never showed %s (last error: %v); it shows:\n%s\nconsole errors: %v", cond, err, text, p.consoleErrors())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// screenshot saves the whole page as a PNG in the test's temp dir, and in
// $KDS_TEST_SCREENSHOTS when set.
func (p *tab) screenshot(t *testing.T, name string) {
	t.Helper()
	var r struct {
		Data string `json:"data"`
	}
	p.call(t, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true}, &r)
	png, err := base64.StdEncoding.DecodeString(r.Data)
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{t.TempDir()}
	if d := os.Getenv("KDS_TEST_SCREENSHOTS"); d != "" {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		path := filepath.Join(d, name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}
}
