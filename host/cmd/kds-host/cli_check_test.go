package main

import (
	"context"
	"errors"
	"testing"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

func TestCheckGatesOnRejects(t *testing.T) {
	g := NewWithT(t)
	st, err := store.Open(t.Context(), "", t.TempDir())
	g.Expect(err).NotTo(HaveOccurred())
	defer st.Close()
	reg := resource.Default()
	m := resource.Resource{Kind: "Mesh", Name: "default"}
	g.Expect(reg.Validate(&m)).To(Succeed())
	_, _, err = st.Put(t.Context(), m)
	g.Expect(err).NotTo(HaveOccurred())
	gl, err := controlplane.NewGlobal(controlplane.GlobalConfig{Store: st, Registry: reg, KDSAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0",
		DiagAddr: "127.0.0.1:0", Logger: hclog.NewNullLogger(), Builtin: retrypolicy.New(), OwnerHolds: true})
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- gl.Run(ctx) }()
	defer func() { cancel(); <-done }()
	cp := "http://" + gl.APIAddr()
	ok := writeFile(t, "ok.yaml", "type: MeshTimeout\nmesh: default\nname: a\nspec: {default: {idleTimeout: 1s}}\n")
	var res cliResult
	g.Eventually(func() error { // 503 until the global has loaded its store
		res = runCLI(t, "", "check", "-f", ok, "--cp", cp)
		return res.err
	}).Should(Succeed())
	g.Expect(res.stdout).To(ContainSubstring("MeshTimeout/default/a"))
	g.Expect(res.stdout).To(ContainSubstring("WAIT")) // an empty zone: it waits for Mesh default

	bad := writeFile(t, "bad.yaml", "type: MeshTimeout\nmesh: default\nname: a\nspec: {default: {idleTimeout: 1s}}\n---\ntype: MeshRetry\nmesh: nowhere\nname: b\nspec: {default: {tcp: {maxConnectAttempt: 3}}}\n")
	res = runCLI(t, "", "check", "-f", bad, "--cp", cp, "-o", "json")
	g.Expect(errors.Is(res.err, errRejected)).To(BeTrue())
	g.Expect(res.stdout).To(ContainSubstring(`"rejected": 1`))
	g.Expect(res.stderr).To(ContainSubstring("1 of 2 resources would be rejected"))

	res = runCLI(t, "", "check", "-f", writeFile(t, "x.yaml", "type: Nope\nname: a\n"), "--cp", cp)
	g.Expect(res.err).To(MatchError(ContainSubstring("unknown kind")))
}

// The surprises a new user met, each with what the CLI now says.
func TestTheCLISaysWhatToDo(t *testing.T) {
	g := NewWithT(t)
	st, err := store.Open(t.Context(), "", t.TempDir())
	g.Expect(err).NotTo(HaveOccurred())
	defer st.Close()
	reg := resource.Default()
	gl, err := controlplane.NewGlobal(controlplane.GlobalConfig{Store: st, Registry: reg, KDSAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0",
		DiagAddr: "127.0.0.1:0", Logger: hclog.NewNullLogger(), Builtin: retrypolicy.New(), OwnerHolds: true})
	g.Expect(err).NotTo(HaveOccurred())
	zst, err := store.Open(t.Context(), "", t.TempDir())
	g.Expect(err).NotTo(HaveOccurred())
	defer zst.Close()
	z, err := controlplane.NewZone(controlplane.ZoneConfig{Store: zst, Registry: reg, APIAddr: "127.0.0.1:0", DiagAddr: "127.0.0.1:0",
		Logger: hclog.NewNullLogger(), KDS: zoneConfig(gl.KDSAddr())})
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- gl.Run(ctx) }()
	go func() { done <- z.Run(ctx) }()
	defer func() { cancel(); <-done; <-done }()
	cp, zoneCP := "http://"+gl.APIAddr(), "http://"+z.APIAddr()

	// A client command that reaches a zone's API is told to use the global's.
	res := runCLI(t, "", "inspect", "zones", "--cp", zoneCP)
	g.Expect(res.err).To(MatchError(ContainSubstring("is a zone control plane's API")))
	g.Expect(res.err.Error()).To(ContainSubstring("use the global's: --cp"))

	// check --zone with a zone the global never saw warns.
	ok := writeFile(t, "ok.yaml", "type: Mesh\nname: default\n")
	g.Eventually(func() error {
		res = runCLI(t, "", "check", "-f", ok, "--cp", cp, "--zone", "nosuchzone")
		return res.err
	}).Should(Succeed())
	g.Expect(res.stderr).To(ContainSubstring(`warning: zone "nosuchzone" has not connected to this global`))

	// A kind typed slightly wrong gets a suggestion.
	res = runCLI(t, "", "get", "meshtimeout", "--cp", cp)
	g.Expect(res.err).NotTo(HaveOccurred())
	res = runCLI(t, "", "get", "meshtimeuots", "--cp", cp)
	g.Expect(res.err).To(MatchError(ContainSubstring(`did you mean "meshtimeouts"?`)))
}

// zoneConfig is a zone of the global at kdsAddr that authenticates with nothing (the test's
// global has no keys: authentication is off).
func zoneConfig(kdsAddr string) zone.Config {
	return zone.Config{Zone: "zone-1", GlobalAddress: "grpc://" + kdsAddr}
}
