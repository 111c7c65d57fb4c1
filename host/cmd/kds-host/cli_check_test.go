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
	ok := writeFile(t, "ok.yaml", "type: MeshTimeout\nmesh: default\nname: a\n")
	var res cliResult
	g.Eventually(func() error { // 503 until the global has loaded its store
		res = runCLI(t, "", "check", "-f", ok, "--cp", cp)
		return res.err
	}).Should(Succeed())
	g.Expect(res.stdout).To(ContainSubstring("MeshTimeout/default/a"))
	g.Expect(res.stdout).To(ContainSubstring("WAIT")) // an empty zone: it waits for Mesh default

	bad := writeFile(t, "bad.yaml", "type: MeshTimeout\nmesh: default\nname: a\n---\ntype: MeshRetry\nmesh: nowhere\nname: b\n")
	res = runCLI(t, "", "check", "-f", bad, "--cp", cp, "-o", "json")
	g.Expect(errors.Is(res.err, errRejected)).To(BeTrue())
	g.Expect(res.stdout).To(ContainSubstring(`"rejected": 1`))
	g.Expect(res.stderr).To(ContainSubstring("1 of 2 resources would be rejected"))

	res = runCLI(t, "", "check", "-f", writeFile(t, "x.yaml", "type: Nope\nname: a\n"), "--cp", cp)
	g.Expect(res.err).To(MatchError(ContainSubstring("unknown kind")))
}
