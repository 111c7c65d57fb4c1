package resource

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

// A schema is a Go type read as a description of a decoded JSON value: a struct is an object
// whose keys are its fields' json names (any other key is an unknown field), a slice is a list,
// a map[string]T an object of Ts, string, bool, the integer and float kinds are JSON strings,
// booleans and numbers, and `any` is any value. Tags on a field: `kds:"required"` (present and
// not null) and `kds:"enum=A|B"` (a string, or each string of a list, is one of those). A type
// with a checkValue method (Duration, Decimal, TargetRefKind) checks its value itself; a struct
// with a checkObject method checks what concerns several of its fields.
//
// The schema is compiled once per kind; checking a spec walks the decoded map and returns the
// first wrong field with its full path ("to[0].default.connectionTimeout").

// valueChecker is a scalar type that checks a decoded value; it returns "" or the reason.
type valueChecker interface{ checkValue(v any) string }

// objectChecker is a struct type that checks an object whose fields are each valid; it returns
// nil or the error, its Field relative to the object ("name").
type objectChecker interface {
	checkObject(obj map[string]any) *ValidationError
}

var (
	valueCheckerType  = reflect.TypeFor[valueChecker]()
	objectCheckerType = reflect.TypeFor[objectChecker]()
)

type nodeKind int

const (
	anyNode nodeKind = iota
	objectNode
	listNode
	mapNode
	stringNode
	boolNode
	integerNode
	numberNode
	scalarNode
)

type node struct {
	kind     nodeKind
	fields   []field        // objectNode, in declaration order
	byName   map[string]int // objectNode: json name -> index in fields
	known    string         // objectNode: the field names, sorted, for messages
	object   objectChecker  // objectNode, optional
	elem     *node          // listNode, mapNode
	min, max float64        // integerNode
	enum     []string       // stringNode, optional
	scalar   valueChecker   // scalarNode
}

type field struct {
	name     string
	required bool
	node     *node
}

// compileSchema compiles T; it panics on a type it cannot read (a programming error).
func compileSchema[T any]() *node { return compile(reflect.TypeFor[T](), nil) }

func compile(t reflect.Type, enum []string) *node {
	if t.Implements(valueCheckerType) {
		return &node{kind: scalarNode, scalar: reflect.Zero(t).Interface().(valueChecker)}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return compile(t.Elem(), enum)
	case reflect.Interface:
		return &node{kind: anyNode}
	case reflect.Slice:
		return &node{kind: listNode, elem: compile(t.Elem(), enum)}
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			panic(fmt.Sprintf("schema %s: map keys must be strings", t))
		}
		return &node{kind: mapNode, elem: compile(t.Elem(), enum)}
	case reflect.String:
		return &node{kind: stringNode, enum: enum}
	case reflect.Bool:
		return &node{kind: boolNode}
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Int:
		bits := t.Bits()
		return &node{kind: integerNode, min: -math.Exp2(float64(bits - 1)), max: math.Exp2(float64(bits-1)) - 1}
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uint:
		return &node{kind: integerNode, min: 0, max: math.Exp2(float64(t.Bits())) - 1}
	case reflect.Float32, reflect.Float64:
		return &node{kind: numberNode}
	case reflect.Struct:
		n := &node{kind: objectNode, byName: map[string]int{}}
		if t.Implements(objectCheckerType) {
			n.object = reflect.Zero(t).Interface().(objectChecker)
		}
		var names []string
		for i := range t.NumField() {
			sf := t.Field(i)
			name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				panic(fmt.Sprintf("schema %s: field %s has no json name", t, sf.Name))
			}
			f := field{name: name}
			var fenum []string
			for opt := range strings.SplitSeq(sf.Tag.Get("kds"), ",") {
				switch {
				case opt == "":
				case opt == "required":
					f.required = true
				case strings.HasPrefix(opt, "enum="):
					fenum = strings.Split(strings.TrimPrefix(opt, "enum="), "|")
				default:
					panic(fmt.Sprintf("schema %s: field %s: unknown kds tag option %q", t, sf.Name, opt))
				}
			}
			f.node = compile(sf.Type, fenum)
			n.byName[name] = len(n.fields)
			n.fields = append(n.fields, f)
			names = append(names, name)
		}
		sort.Strings(names)
		n.known = strings.Join(names, ", ")
		return n
	}
	panic(fmt.Sprintf("schema: cannot read type %s", t))
}

// check returns the first wrong field of v under path, or nil.
func (n *node) check(path string, v any) *ValidationError {
	switch n.kind {
	case anyNode:
		return nil
	case scalarNode:
		if reason := n.scalar.checkValue(v); reason != "" {
			return &ValidationError{Field: path, Reason: reason}
		}
	case stringNode:
		s, ok := v.(string)
		if !ok {
			return wrongType(path, "a string", v)
		}
		if len(n.enum) > 0 && !contains(n.enum, s) {
			return &ValidationError{Field: path, Reason: fmt.Sprintf("%q is not one of %s", s, strings.Join(n.enum, ", "))}
		}
	case boolNode:
		if _, ok := v.(bool); !ok {
			return wrongType(path, "true or false", v)
		}
	case numberNode:
		if _, ok := v.(float64); !ok {
			return wrongType(path, "a number", v)
		}
	case integerNode:
		f, ok := v.(float64)
		if !ok {
			return wrongType(path, "an integer", v)
		}
		if f != math.Trunc(f) || f < n.min || f > n.max {
			return &ValidationError{Field: path, Reason: fmt.Sprintf("must be an integer from %.0f to %.0f, not %v", n.min, n.max, f)}
		}
	case listNode:
		l, ok := v.([]any)
		if !ok {
			return wrongType(path, "a list", v)
		}
		for i, e := range l {
			if err := n.elem.check(fmt.Sprintf("%s[%d]", path, i), e); err != nil {
				return err
			}
		}
	case mapNode:
		m, ok := v.(map[string]any)
		if !ok {
			return wrongType(path, "an object", v)
		}
		for _, k := range sortedKeys(m) {
			if err := n.elem.check(fmt.Sprintf("%s[%q]", path, k), m[k]); err != nil {
				return err
			}
		}
	case objectNode:
		m, ok := v.(map[string]any)
		if !ok {
			return wrongType(path, "an object", v)
		}
		for _, k := range sortedKeys(m) {
			if _, ok := n.byName[k]; !ok {
				return &ValidationError{Field: join(path, k), Reason: "unknown field (known: " + n.known + ")"}
			}
		}
		for _, f := range n.fields {
			fv, present := m[f.name]
			if !present || fv == nil {
				if f.required {
					return &ValidationError{Field: join(path, f.name), Reason: "is required"}
				}
				continue
			}
			if err := f.node.check(join(path, f.name), fv); err != nil {
				return err
			}
		}
		if n.object != nil {
			if err := n.object.checkObject(m); err != nil {
				return &ValidationError{Field: join(path, err.Field), Reason: err.Reason}
			}
		}
	}
	return nil
}

// validator returns a Kind.Validate that checks a spec against the schema n.
func (n *node) validator() func(map[string]any) error {
	return func(spec map[string]any) error {
		if err := n.check("", spec); err != nil {
			return err
		}
		return nil
	}
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	if name == "" {
		return path
	}
	return path + "." + name
}

func wrongType(path, want string, v any) *ValidationError {
	return &ValidationError{Field: path, Reason: fmt.Sprintf("must be %s, not a JSON %s", want, jsonType(v))}
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	case float64:
		return "number"
	}
	return fmt.Sprintf("%T", v)
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// Duration is a Go duration string, not negative: "5s", "1m30s", "0s".
type Duration string

func (Duration) checkValue(v any) string {
	s, ok := v.(string)
	if !ok {
		return fmt.Sprintf("must be a duration such as \"10s\", not a JSON %s", jsonType(v))
	}
	if d, err := time.ParseDuration(s); err != nil || d < 0 {
		return fmt.Sprintf("%q is not a duration (e.g. 10s, 1m30s)", s)
	}
	return ""
}

// Decimal is Kuma's int-or-string number: a JSON number or a string holding one ("99.9").
type Decimal string

func (Decimal) checkValue(v any) string {
	switch t := v.(type) {
	case float64:
		return ""
	case string:
		if _, err := strconv.ParseFloat(t, 64); err == nil {
			return ""
		}
		return fmt.Sprintf("%q is not a number", t)
	}
	return fmt.Sprintf("must be a number or a string holding one, not a JSON %s", jsonType(v))
}
