package resource_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"

	"github.com/kds-host/kds-host/host/resource"
)

func TestPlurals(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	var plurals []string
	for _, k := range reg.Kinds() {
		plurals = append(plurals, k.Plural)
	}
	g.Expect(plurals).To(Equal([]string{"meshes", "meshtimeouts", "meshretries", "meshcircuitbreakers",
		"meshhealthchecks", "meshratelimits", "meshtrafficpermissions", "meshaccesslogs", "meshfaultinjections"}))
	for _, s := range []string{"MeshRetry", "meshretry", "meshretries", "MESHRETRIES"} {
		k, ok := reg.Lookup(s)
		g.Expect(ok).To(BeTrue(), s)
		g.Expect(k.Name).To(Equal("MeshRetry"))
	}
}

func TestValidate(t *testing.T) {
	reg := resource.Default()
	for _, tc := range []struct {
		name  string
		r     resource.Resource
		field string
	}{
		{"unknown kind", resource.Resource{Kind: "Nope", Name: "a"}, "type"},
		{"bad name", resource.Resource{Kind: "Mesh", Name: "Bad_Name"}, "name"},
		{"mesh on a global kind", resource.Resource{Kind: "Mesh", Name: "a", Mesh: "x"}, "mesh"},
		{"policy without mesh", resource.Resource{Kind: "MeshTimeout", Name: "a"}, "mesh"},
		{"spec not an object", resource.Resource{Kind: "MeshTimeout", Mesh: "m", Name: "a", Spec: json.RawMessage(`[1]`)}, "spec"},
		{"bad duration", resource.Resource{Kind: "MeshTimeout", Mesh: "m", Name: "a", Spec: json.RawMessage(`{"default":{"connectionTimeout":"abc"}}`)}, "spec.default.connectionTimeout"},
		{"unknown owner kind", resource.Resource{Kind: "MeshTimeout", Mesh: "m", Name: "a", Owners: []resource.Key{{Kind: "X", Name: "b"}}}, "owners[0].kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			err := reg.Validate(&tc.r)
			var ve *resource.ValidationError
			g.Expect(errors.As(err, &ve)).To(BeTrue(), "%v", err)
			g.Expect(ve.Field).To(Equal(tc.field))
		})
	}
	g := NewWithT(t)
	ok := resource.Resource{Kind: "MeshTimeout", Mesh: "m", Name: "a", Spec: json.RawMessage(`{ "default": {"connectionTimeout": "5s"} }`)}
	g.Expect(reg.Validate(&ok)).To(Succeed())
	g.Expect(string(ok.Spec)).To(Equal(`{"default":{"connectionTimeout":"5s"}}`))
	for _, d := range resource.MeshDefaults("default") {
		g.Expect(reg.Validate(&d)).To(Succeed(), d.Name)
	}
}

func TestVersionSurvivesTheWire(t *testing.T) {
	g := NewWithT(t)
	r := resource.Resource{Kind: "MeshTimeout", Mesh: "m", Name: "a", Labels: map[string]string{"x": "y"},
		Spec: json.RawMessage(`{"n":1024,"f":1.5,"s":"5s","l":[1,"a",true,null]}`), Generation: 3}
	p, err := r.ToProto()
	g.Expect(err).NotTo(HaveOccurred())
	back, err := resource.FromProto(p)
	g.Expect(err).NotTo(HaveOccurred())
	back.Generation = 7
	p2, err := back.ToProto()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resource.Version(p2)).To(Equal(resource.Version(p)), "equal content, equal version, whatever the generation")
	r.Spec = json.RawMessage(`{"n":1025}`)
	p3, _ := r.ToProto()
	g.Expect(resource.Version(p3)).NotTo(Equal(resource.Version(p)))
}

// TestSchemas holds each built-in kind to its schema: a spec in Kuma's shape is valid, and each
// wrong one is refused naming the field by its full path.
func TestSchemas(t *testing.T) {
	reg := resource.Default()
	for _, tc := range []struct {
		name, kind, spec string
		field, reason    string // "" for a valid spec
	}{
		{"Mesh without spec", "Mesh", ``, "", ""},
		{"Mesh", "Mesh", `{"mtls":{"enabledBackend":"ca-1","backends":[{"name":"ca-1","type":"builtin"}]},"networking":{"outbound":{"passthrough":false}},"skipCreatingInitialPolicies":["*"]}`, "", ""},
		{"Mesh unknown field", "Mesh", `{"mtsl":{}}`, "spec.mtsl", "unknown field (known: constraints, logging, meshServices, metrics, mtls, networking, routing, skipCreatingInitialPolicies, tracing)"},

		{"MeshTimeout", "MeshTimeout", `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"backend"},"default":{"connectionTimeout":"2s","idleTimeout":"30s","http":{"requestTimeout":"5s","maxConnectionDuration":"0s"}}}],"from":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1h"}}]}`, "", ""},
		{"MeshTimeout rules", "MeshTimeout", `{"rules":[{"matches":[{"spiffeID":{"type":"Prefix","value":"spiffe://default/"}}],"default":{"connectionTimeout":"1s"}}]}`, "", ""},
		{"MeshTimeout shorthand default", "MeshTimeout", `{"targetRef":{"kind":"MeshSubset","tags":{"kuma.io/zone":"east"},"proxyTypes":["Sidecar"]},"default":{"connectionTimeout":"3s"}}`, "", ""},
		{"MeshTimeout no spec", "MeshTimeout", ``, "spec", "is required for MeshTimeout"},
		{"MeshTimeout null spec", "MeshTimeout", `null`, "spec", "is required for MeshTimeout"},
		{"MeshTimeout unknown field", "MeshTimeout", `{"default":{"bogus":"1s"}}`, "spec.default.bogus", "unknown field (known: connectionTimeout, http, idleTimeout)"},
		{"MeshTimeout unknown top-level field", "MeshTimeout", `{"targetRef":{"kind":"Mesh"},"too":[]}`, "spec.too", "unknown field (known: default, from, rules, targetRef, to)"},
		{"MeshTimeout unknown targetRef kind", "MeshTimeout", `{"targetRef":{"kind":"Nope"},"default":{"idleTimeout":"1s"}}`, "spec.targetRef.kind", `unknown kind "Nope" (known: Mesh, MeshSubset, MeshService, MeshServiceSubset, MeshGateway, MeshHTTPRoute, MeshExternalService, MeshMultiZoneService)`},
		{"MeshTimeout targetRef without kind", "MeshTimeout", `{"targetRef":{"name":"x"}}`, "spec.targetRef.kind", "is required"},
		{"MeshTimeout to item without default", "MeshTimeout", `{"to":[{"targetRef":{"kind":"Mesh"}}]}`, "spec.to[0].default", "is required"},
		{"MeshTimeout to item without targetRef", "MeshTimeout", `{"to":[{"default":{"idleTimeout":"1s"}}]}`, "spec.to[0].targetRef", "is required"},
		{"MeshTimeout bad duration", "MeshTimeout", `{"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"abc"}}]}`, "spec.to[0].default.connectionTimeout", `"abc" is not a duration (e.g. 10s, 1m30s)`},
		{"MeshTimeout negative duration", "MeshTimeout", `{"default":{"http":{"requestTimeout":"-1s"}}}`, "spec.default.http.requestTimeout", `"-1s" is not a duration`},
		{"MeshTimeout duration as a number", "MeshTimeout", `{"default":{"idleTimeout":5}}`, "spec.default.idleTimeout", `must be a duration such as "10s", not a JSON number`},
		{"MeshTimeout MeshService without name", "MeshTimeout", `{"to":[{"targetRef":{"kind":"MeshService"},"default":{"idleTimeout":"1s"}}]}`, "spec.to[0].targetRef.name", "is required for kind MeshService (or labels)"},
		{"MeshTimeout bad proxy type", "MeshTimeout", `{"targetRef":{"kind":"Mesh","proxyTypes":["Ingress"]}}`, "spec.targetRef.proxyTypes[0]", `"Ingress" is not one of Sidecar, Gateway`},
		{"MeshTimeout tags not strings", "MeshTimeout", `{"targetRef":{"kind":"MeshSubset","tags":{"version":2}}}`, `spec.targetRef.tags["version"]`, "must be a string, not a JSON number"},
		{"MeshTimeout to not a list", "MeshTimeout", `{"to":{"targetRef":{"kind":"Mesh"}}}`, "spec.to", "must be a list, not a JSON object"},

		{"MeshRetry", "MeshRetry", `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"tcp":{"maxConnectAttempt":5},"http":{"numRetries":5,"perTryTimeout":"16s","backOff":{"baseInterval":"25ms","maxInterval":"250ms"},"retryOn":["5xx","503"],"retriableResponseHeaders":[{"type":"Exact","name":"x-retry","value":"yes"}],"rateLimitedBackOff":{"resetHeaders":[{"name":"retry-after","format":"Seconds"}]}},"grpc":{"numRetries":2,"retryOn":["Unavailable"]}}}]}`, "", ""},
		{"MeshRetry has no from", "MeshRetry", `{"from":[]}`, "spec.from", "unknown field (known: default, targetRef, to)"},
		{"MeshRetry negative retries", "MeshRetry", `{"to":[{"targetRef":{"kind":"Mesh"},"default":{"http":{"numRetries":-1}}}]}`, "spec.to[0].default.http.numRetries", "must be an integer from 0 to 4294967295, not -1"},
		{"MeshRetry fractional retries", "MeshRetry", `{"to":[{"targetRef":{"kind":"Mesh"},"default":{"http":{"numRetries":1.5}}}]}`, "spec.to[0].default.http.numRetries", "must be an integer"},
		{"MeshRetry reset header format", "MeshRetry", `{"default":{"http":{"rateLimitedBackOff":{"resetHeaders":[{"name":"retry-after","format":"Minutes"}]}}}}`, "spec.default.http.rateLimitedBackOff.resetHeaders[0].format", `"Minutes" is not one of Seconds, UnixTimestamp`},

		{"MeshCircuitBreaker", "MeshCircuitBreaker", `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionLimits":{"maxConnections":1024,"maxRetries":3},"outlierDetection":{"disabled":false,"interval":"10s","baseEjectionTime":"30s","healthyPanicThreshold":"50.5","detectors":{"totalFailures":{"consecutive":5},"successRate":{"standardDeviationFactor":1.9}}}}}]}`, "", ""},
		{"MeshCircuitBreaker disabled not a bool", "MeshCircuitBreaker", `{"default":{"outlierDetection":{"disabled":"no"}}}`, "spec.default.outlierDetection.disabled", "must be true or false, not a JSON string"},
		{"MeshCircuitBreaker bad decimal", "MeshCircuitBreaker", `{"default":{"outlierDetection":{"healthyPanicThreshold":"half"}}}`, "spec.default.outlierDetection.healthyPanicThreshold", `"half" is not a number`},

		{"MeshHealthCheck", "MeshHealthCheck", `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"backend"},"default":{"interval":"10s","timeout":"2s","unhealthyThreshold":3,"healthyThreshold":1,"http":{"path":"/health","expectedStatuses":[200,204],"requestHeadersToAdd":{"set":[{"name":"x","value":"y"}]}},"tcp":{"disabled":true}}}]}`, "", ""},
		{"MeshHealthCheck bad interval", "MeshHealthCheck", `{"to":[{"targetRef":{"kind":"Mesh"},"default":{"interval":"often"}}]}`, "spec.to[0].default.interval", `"often" is not a duration`},
		{"MeshHealthCheck header without value", "MeshHealthCheck", `{"default":{"http":{"requestHeadersToAdd":{"add":[{"name":"x"}]}}}}`, "spec.default.http.requestHeadersToAdd.add[0].value", "is required"},

		{"MeshRateLimit", "MeshRateLimit", `{"targetRef":{"kind":"MeshService","name":"backend"},"from":[{"targetRef":{"kind":"Mesh"},"default":{"local":{"http":{"requestRate":{"num":100,"interval":"1s"},"onRateLimit":{"status":429,"headers":{"add":[{"name":"x-limited","value":"true"}]}}},"tcp":{"connectionRate":{"num":10,"interval":"1s"}}}}}]}`, "", ""},
		{"MeshRateLimit rate without interval", "MeshRateLimit", `{"from":[{"targetRef":{"kind":"Mesh"},"default":{"local":{"http":{"requestRate":{"num":100}}}}}]}`, "spec.from[0].default.local.http.requestRate.interval", "is required"},

		{"MeshTrafficPermission", "MeshTrafficPermission", `{"targetRef":{"kind":"MeshService","name":"backend"},"from":[{"targetRef":{"kind":"MeshSubset","tags":{"kuma.io/zone":"east"}},"default":{"action":"Allow"}},{"targetRef":{"kind":"Mesh"},"default":{"action":"DENY"}}]}`, "", ""},
		{"MeshTrafficPermission rules", "MeshTrafficPermission", `{"rules":[{"default":{"allow":[{"spiffeID":{"type":"Exact","value":"spiffe://default/ns/web"}}]}}]}`, "", ""},
		{"MeshTrafficPermission bad action", "MeshTrafficPermission", `{"from":[{"targetRef":{"kind":"Mesh"},"default":{"action":"Maybe"}}]}`, "spec.from[0].default.action", `"Maybe" is not one of Allow, Deny, AllowWithShadowDeny, ALLOW, DENY, ALLOW_WITH_SHADOW_DENY`},
		{"MeshTrafficPermission has no to", "MeshTrafficPermission", `{"to":[]}`, "spec.to", "unknown field (known: default, from, rules, targetRef)"},

		{"MeshAccessLog", "MeshAccessLog", `{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"backends":[{"file":{"path":"/tmp/access.log","format":{"type":"Json","json":[{"key":"start","value":"%START_TIME%"}]}}},{"tcp":{"address":"logs:5000"}},{"openTelemetry":{"endpoint":"otel:4317","body":{"kvlistValue":{}}}}]}}]}`, "", ""},
		{"MeshAccessLog file without path", "MeshAccessLog", `{"from":[{"targetRef":{"kind":"Mesh"},"default":{"backends":[{"file":{}}]}}]}`, "spec.from[0].default.backends[0].file.path", "is required"},
		{"MeshAccessLog bad format type", "MeshAccessLog", `{"default":{"backends":[{"tcp":{"address":"a:1","format":{"type":"Xml"}}}]}}`, "spec.default.backends[0].tcp.format.type", `"Xml" is not one of Plain, Json`},

		{"MeshFaultInjection", "MeshFaultInjection", `{"targetRef":{"kind":"MeshService","name":"backend"},"from":[{"targetRef":{"kind":"Mesh"},"default":{"http":[{"abort":{"httpStatus":500,"percentage":"2.5"}},{"delay":{"value":"5s","percentage":5}},{"responseBandwidth":{"limit":"10mbps","percentage":50}}]}}]}`, "", ""},
		{"MeshFaultInjection abort without percentage", "MeshFaultInjection", `{"from":[{"targetRef":{"kind":"Mesh"},"default":{"http":[{"abort":{"httpStatus":500}}]}}]}`, "spec.from[0].default.http[0].abort.percentage", "is required"},
		{"MeshFaultInjection bad delay", "MeshFaultInjection", `{"to":[{"targetRef":{"kind":"Mesh"},"default":{"http":[{"delay":{"value":"soon","percentage":5}}]}}]}`, "spec.to[0].default.http[0].delay.value", `"soon" is not a duration`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			r := resource.Resource{Kind: tc.kind, Name: "a"}
			if tc.kind != resource.MeshKind {
				r.Mesh = "m"
			}
			if tc.spec != "" {
				r.Spec = json.RawMessage(tc.spec)
			}
			err := reg.Validate(&r)
			if tc.field == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			var ve *resource.ValidationError
			g.Expect(errors.As(err, &ve)).To(BeTrue(), "%v", err)
			g.Expect(ve.Field).To(Equal(tc.field))
			g.Expect(ve.Reason).To(HavePrefix(tc.reason))
		})
	}
}

// TestExamplesAreValid holds examples/resources to the schemas.
func TestExamplesAreValid(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	files, err := filepath.Glob("../../examples/resources/*.yaml")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(files).NotTo(BeEmpty())
	for _, f := range files {
		b, err := os.ReadFile(f)
		g.Expect(err).NotTo(HaveOccurred())
		j, err := yaml.YAMLToJSON(b)
		g.Expect(err).NotTo(HaveOccurred(), f)
		var r resource.Resource
		g.Expect(json.Unmarshal(j, &r)).To(Succeed(), f)
		g.Expect(reg.Validate(&r)).To(Succeed(), f)
	}
}

// Label keys and values follow Kubernetes' rules; the error names the label. Before, a 1 MB
// value or a key of HTML was stored and sent to every zone.
func TestLabelsAreValidatedAsKubernetesDoes(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	for _, ok := range []map[string]string{
		{"kuma.io/origin": "global", "app": "", "a.b-c_d": "x.Y-z_1", "k8s.io/x": strings.Repeat("v", 63)},
	} {
		r := resource.Resource{Kind: "Mesh", Name: "m", Labels: ok}
		g.Expect(reg.Validate(&r)).To(Succeed())
	}
	for label, field := range map[[2]string]string{
		{"<script>", "x"}:                   `labels["<script>"]`,
		{"app", strings.Repeat("v", 1<<20)}: `labels["app"]`,
		{"app", "-x"}:                       `labels["app"]`,
		{"Bad_Prefix/x", "v"}:               `labels["Bad_Prefix/x"]`,
		{strings.Repeat("k", 64), "v"}:      `labels["` + strings.Repeat("k", 64) + `"]`,
		{"kuma.io/", "v"}:                   `labels["kuma.io/"]`,
	} {
		r := resource.Resource{Kind: "Mesh", Name: "m", Labels: map[string]string{label[0]: label[1]}}
		err := reg.Validate(&r)
		var ve *resource.ValidationError
		g.Expect(errors.As(err, &ve)).To(BeTrue(), label[0])
		g.Expect(ve.Field).To(Equal(field))
	}
	many := map[string]string{}
	for i := range resource.MaxLabels + 1 {
		many[fmt.Sprintf("l%d", i)] = ""
	}
	r := resource.Resource{Kind: "Mesh", Name: "m", Labels: many}
	g.Expect(reg.Validate(&r)).To(MatchError(ContainSubstring("at most 64")))
}
