package resource

import (
	"fmt"
	"strings"
)

// The schemas of the built-in kinds, after Kuma's policy types (pkg/plugins/policies/*/api):
// compact, but every field Kuma has in these places is known, so an unknown one is refused.
// A policy's spec has an optional top-level targetRef and its kind's sections: `to` and/or
// `from` items {targetRef, default} (both required), `rules` items {matches, default} (default
// required), and kds-host's shorthand `default`, the configuration for the top-level targetRef
// itself, which Kuma's MeshTimeout does not have but this repository's tools and tests use.

// TargetRefKind is the kind a targetRef names.
type TargetRefKind string

// targetRefKinds are the kinds a targetRef may name, as in Kuma's common TargetRef.
var targetRefKinds = []string{
	"Mesh", "MeshSubset", "MeshService", "MeshServiceSubset", "MeshGateway", "MeshHTTPRoute",
	"MeshExternalService", "MeshMultiZoneService",
}

func (TargetRefKind) checkValue(v any) string {
	s, ok := v.(string)
	if !ok {
		return fmt.Sprintf("must be a string, not a JSON %s", jsonType(v))
	}
	if !contains(targetRefKinds, s) {
		return fmt.Sprintf("unknown kind %q (known: %s)", s, strings.Join(targetRefKinds, ", "))
	}
	return ""
}

// targetRef selects what a policy applies to, or the peers of a to/from item.
type targetRef struct {
	Kind        TargetRefKind     `json:"kind" kds:"required"`
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	Mesh        string            `json:"mesh"`
	Tags        map[string]string `json:"tags"`
	Labels      map[string]string `json:"labels"`
	ProxyTypes  []string          `json:"proxyTypes" kds:"enum=Sidecar|Gateway"`
	SectionName string            `json:"sectionName"`
}

// checkObject: a kind that names one resource needs its name (or, in newer Kuma, labels).
func (targetRef) checkObject(obj map[string]any) *ValidationError {
	switch obj["kind"] {
	case "MeshService", "MeshServiceSubset", "MeshGateway", "MeshHTTPRoute", "MeshExternalService", "MeshMultiZoneService":
		if obj["name"] == nil && obj["labels"] == nil {
			return &ValidationError{Field: "name", Reason: fmt.Sprintf("is required for kind %s (or labels)", obj["kind"])}
		}
	}
	return nil
}

// item is one entry of `to` or `from`: the peers and their configuration.
type item[C any] struct {
	TargetRef targetRef `json:"targetRef" kds:"required"`
	Default   C         `json:"default" kds:"required"`
}

// rule is one entry of `rules` (Kuma 2.9+): inbound configuration, optionally for some peers.
type rule[C any] struct {
	Matches []match `json:"matches"`
	Default C       `json:"default" kds:"required"`
}

type match struct {
	SpiffeID *struct {
		Type  string `json:"type" kds:"required,enum=Exact|Prefix"`
		Value string `json:"value" kds:"required"`
	} `json:"spiffeID"`
}

// toFrom is the shape of a policy with outbound (to), inbound (from) and rules sections.
type toFrom[C any] struct {
	TargetRef *targetRef `json:"targetRef"`
	To        []item[C]  `json:"to"`
	From      []item[C]  `json:"from"`
	Rules     []rule[C]  `json:"rules"`
	Default   *C         `json:"default"`
}

// toOnly is the shape of an outbound-only policy (MeshRetry, MeshHealthCheck).
type toOnly[C any] struct {
	TargetRef *targetRef `json:"targetRef"`
	To        []item[C]  `json:"to"`
	Default   *C         `json:"default"`
}

// fromOnly is the shape of an inbound-only policy (MeshTrafficPermission).
type fromOnly[C any] struct {
	TargetRef *targetRef `json:"targetRef"`
	From      []item[C]  `json:"from"`
	Rules     []rule[C]  `json:"rules"`
	Default   *C         `json:"default"`
}

type headerValue struct {
	Name  string `json:"name" kds:"required"`
	Value string `json:"value" kds:"required"`
}

type headerModifier struct {
	Set []headerValue `json:"set"`
	Add []headerValue `json:"add"`
}

// MeshTimeout.
type timeoutConf struct {
	ConnectionTimeout Duration `json:"connectionTimeout"`
	IdleTimeout       Duration `json:"idleTimeout"`
	HTTP              *struct {
		RequestTimeout        Duration `json:"requestTimeout"`
		StreamIdleTimeout     Duration `json:"streamIdleTimeout"`
		MaxStreamDuration     Duration `json:"maxStreamDuration"`
		MaxConnectionDuration Duration `json:"maxConnectionDuration"`
		RequestHeadersTimeout Duration `json:"requestHeadersTimeout"`
	} `json:"http"`
}

// MeshRetry.
type retryConf struct {
	TCP *struct {
		MaxConnectAttempt uint32 `json:"maxConnectAttempt"`
	} `json:"tcp"`
	HTTP *struct {
		NumRetries               uint32              `json:"numRetries"`
		PerTryTimeout            Duration            `json:"perTryTimeout"`
		BackOff                  *backOff            `json:"backOff"`
		RateLimitedBackOff       *rateLimitedBackOff `json:"rateLimitedBackOff"`
		RetryOn                  []string            `json:"retryOn"`
		RetriableResponseHeaders []headerMatch       `json:"retriableResponseHeaders"`
		RetriableRequestHeaders  []headerMatch       `json:"retriableRequestHeaders"`
		HostSelection            []struct {
			Predicate       string            `json:"predicate" kds:"required,enum=OmitPreviousHosts|OmitHostsWithTags|OmitPreviousPriorities"`
			Tags            map[string]string `json:"tags"`
			UpdateFrequency int32             `json:"updateFrequency"`
		} `json:"hostSelection"`
		HostSelectionMaxAttempts int64 `json:"hostSelectionMaxAttempts"`
	} `json:"http"`
	GRPC *struct {
		NumRetries         uint32              `json:"numRetries"`
		PerTryTimeout      Duration            `json:"perTryTimeout"`
		BackOff            *backOff            `json:"backOff"`
		RateLimitedBackOff *rateLimitedBackOff `json:"rateLimitedBackOff"`
		RetryOn            []string            `json:"retryOn"`
	} `json:"grpc"`
}

type backOff struct {
	BaseInterval Duration `json:"baseInterval"`
	MaxInterval  Duration `json:"maxInterval"`
}

type rateLimitedBackOff struct {
	ResetHeaders []struct {
		Name   string `json:"name" kds:"required"`
		Format string `json:"format" kds:"required,enum=Seconds|UnixTimestamp"`
	} `json:"resetHeaders"`
	MaxInterval Duration `json:"maxInterval"`
}

type headerMatch struct {
	Type  string `json:"type" kds:"enum=Exact|Prefix|RegularExpression|Absent|Present"`
	Name  string `json:"name" kds:"required"`
	Value string `json:"value"`
}

// MeshCircuitBreaker.
type circuitBreakerConf struct {
	ConnectionLimits *struct {
		MaxConnections     uint32 `json:"maxConnections"`
		MaxConnectionPools uint32 `json:"maxConnectionPools"`
		MaxPendingRequests uint32 `json:"maxPendingRequests"`
		MaxRequests        uint32 `json:"maxRequests"`
		MaxRetries         uint32 `json:"maxRetries"`
	} `json:"connectionLimits"`
	OutlierDetection *struct {
		Disabled                    bool     `json:"disabled"`
		Interval                    Duration `json:"interval"`
		BaseEjectionTime            Duration `json:"baseEjectionTime"`
		MaxEjectionPercent          uint32   `json:"maxEjectionPercent"`
		SplitExternalAndLocalErrors bool     `json:"splitExternalAndLocalErrors"`
		HealthyPanicThreshold       Decimal  `json:"healthyPanicThreshold"`
		Detectors                   *struct {
			TotalFailures       *consecutive `json:"totalFailures"`
			GatewayFailures     *consecutive `json:"gatewayFailures"`
			LocalOriginFailures *consecutive `json:"localOriginFailures"`
			SuccessRate         *struct {
				MinimumHosts            uint32  `json:"minimumHosts"`
				RequestVolume           uint32  `json:"requestVolume"`
				StandardDeviationFactor Decimal `json:"standardDeviationFactor"`
			} `json:"successRate"`
			FailurePercentage *struct {
				MinimumHosts  uint32 `json:"minimumHosts"`
				RequestVolume uint32 `json:"requestVolume"`
				Threshold     uint32 `json:"threshold"`
			} `json:"failurePercentage"`
		} `json:"detectors"`
	} `json:"outlierDetection"`
}

type consecutive struct {
	Consecutive uint32 `json:"consecutive"`
}

// MeshHealthCheck.
type healthCheckConf struct {
	Interval                     Duration `json:"interval"`
	Timeout                      Duration `json:"timeout"`
	UnhealthyThreshold           int32    `json:"unhealthyThreshold"`
	HealthyThreshold             int32    `json:"healthyThreshold"`
	InitialJitter                Duration `json:"initialJitter"`
	IntervalJitter               Duration `json:"intervalJitter"`
	IntervalJitterPercent        int32    `json:"intervalJitterPercent"`
	HealthyPanicThreshold        Decimal  `json:"healthyPanicThreshold"`
	FailTrafficOnPanic           bool     `json:"failTrafficOnPanic"`
	NoTrafficInterval            Duration `json:"noTrafficInterval"`
	EventLogPath                 string   `json:"eventLogPath"`
	AlwaysLogHealthCheckFailures bool     `json:"alwaysLogHealthCheckFailures"`
	ReuseConnection              bool     `json:"reuseConnection"`
	TCP                          *struct {
		Disabled bool     `json:"disabled"`
		Send     string   `json:"send"`
		Receive  []string `json:"receive"`
	} `json:"tcp"`
	HTTP *struct {
		Disabled            bool            `json:"disabled"`
		Path                string          `json:"path"`
		RequestHeadersToAdd *headerModifier `json:"requestHeadersToAdd"`
		ExpectedStatuses    []int32         `json:"expectedStatuses"`
	} `json:"http"`
	GRPC *struct {
		Disabled    bool   `json:"disabled"`
		ServiceName string `json:"serviceName"`
		Authority   string `json:"authority"`
	} `json:"grpc"`
}

// MeshRateLimit.
type rateLimitConf struct {
	Local *struct {
		HTTP *struct {
			Disabled    bool  `json:"disabled"`
			RequestRate *rate `json:"requestRate"`
			OnRateLimit *struct {
				Status  uint32          `json:"status"`
				Headers *headerModifier `json:"headers"`
			} `json:"onRateLimit"`
		} `json:"http"`
		TCP *struct {
			Disabled       bool  `json:"disabled"`
			ConnectionRate *rate `json:"connectionRate"`
		} `json:"tcp"`
	} `json:"local"`
}

type rate struct {
	Num      uint32   `json:"num" kds:"required"`
	Interval Duration `json:"interval" kds:"required"`
}

// MeshTrafficPermission: `action` in from items (Kuma's older upper-case values too), the
// allow/deny lists in rules.
type trafficPermissionConf struct {
	Action              string  `json:"action" kds:"enum=Allow|Deny|AllowWithShadowDeny|ALLOW|DENY|ALLOW_WITH_SHADOW_DENY"`
	Allow               []match `json:"allow"`
	Deny                []match `json:"deny"`
	AllowWithShadowDeny []match `json:"allowWithShadowDeny"`
}

// MeshAccessLog.
type accessLogConf struct {
	Backends []struct {
		TCP *struct {
			Format  *logFormat `json:"format"`
			Address string     `json:"address" kds:"required"`
		} `json:"tcp"`
		File *struct {
			Format *logFormat `json:"format"`
			Path   string     `json:"path" kds:"required"`
		} `json:"file"`
		OpenTelemetry *struct {
			Endpoint   string     `json:"endpoint" kds:"required"`
			Body       any        `json:"body"`
			Attributes []jsonPair `json:"attributes"`
		} `json:"openTelemetry"`
	} `json:"backends"`
}

type logFormat struct {
	Type            string     `json:"type" kds:"required,enum=Plain|Json"`
	Plain           string     `json:"plain"`
	JSON            []jsonPair `json:"json"`
	OmitEmptyValues bool       `json:"omitEmptyValues"`
}

type jsonPair struct {
	Key   string `json:"key" kds:"required"`
	Value string `json:"value" kds:"required"`
}

// MeshFaultInjection.
type faultInjectionConf struct {
	HTTP []struct {
		Abort *struct {
			HTTPStatus int32   `json:"httpStatus" kds:"required"`
			Percentage Decimal `json:"percentage" kds:"required"`
		} `json:"abort"`
		Delay *struct {
			Value      Duration `json:"value" kds:"required"`
			Percentage Decimal  `json:"percentage" kds:"required"`
		} `json:"delay"`
		ResponseBandwidth *struct {
			Limit      string  `json:"limit" kds:"required"`
			Percentage Decimal `json:"percentage" kds:"required"`
		} `json:"responseBandwidth"`
	} `json:"http"`
}

// meshSpec is Kuma's Mesh: its top-level fields are known, what is under them is not checked.
type meshSpec struct {
	MTLS                        any      `json:"mtls"`
	Tracing                     any      `json:"tracing"`
	Logging                     any      `json:"logging"`
	Metrics                     any      `json:"metrics"`
	Networking                  any      `json:"networking"`
	Routing                     any      `json:"routing"`
	Constraints                 any      `json:"constraints"`
	MeshServices                any      `json:"meshServices"`
	SkipCreatingInitialPolicies []string `json:"skipCreatingInitialPolicies"`
}

// builtinSchemas are the spec schemas of Default's kinds, by kind name.
func builtinSchemas() map[string]*node {
	return map[string]*node{
		MeshKind:                compileSchema[meshSpec](),
		"MeshTimeout":           compileSchema[toFrom[timeoutConf]](),
		"MeshRetry":             compileSchema[toOnly[retryConf]](),
		"MeshCircuitBreaker":    compileSchema[toFrom[circuitBreakerConf]](),
		"MeshHealthCheck":       compileSchema[toOnly[healthCheckConf]](),
		"MeshRateLimit":         compileSchema[toFrom[rateLimitConf]](),
		"MeshTrafficPermission": compileSchema[fromOnly[trafficPermissionConf]](),
		"MeshAccessLog":         compileSchema[toFrom[accessLogConf]](),
		"MeshFaultInjection":    compileSchema[toFrom[faultInjectionConf]](),
	}
}
