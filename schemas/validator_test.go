package schemas_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// validator is a minimal JSON Schema (draft 2020-12) validator, just enough
// for the keywords the files in this package use. A keyword it does not know
// is reported as a problem, so a schema can never carry a constraint these
// tests silently ignore.
type validator struct {
	root map[string]any
}

// decodeJSON decodes with json.Number so integers and big numbers survive.
func decodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data")
	}
	return v, nil
}

func newValidator(schema []byte) (*validator, error) {
	root, err := decodeJSON(schema)
	if err != nil {
		return nil, err
	}
	m, ok := root.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("schema is a %T, not an object", root)
	}
	return &validator{root: m}, nil
}

// validateJSON validates a JSON document and returns every problem found.
func (v *validator) validateJSON(doc []byte) []string {
	inst, err := decodeJSON(doc)
	if err != nil {
		return []string{"not JSON: " + err.Error()}
	}
	return v.validate("", v.root, inst)
}

// resolve follows a local $ref ("#/$defs/task").
func (v *validator) resolve(ref string) (any, error) {
	ptr, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil, fmt.Errorf("$ref %q is not local", ref)
	}
	var node any = v.root
	for tok := range strings.SplitSeq(strings.TrimPrefix(ptr, "/"), "/") {
		if tok == "" {
			continue
		}
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := node.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("$ref %q: %q is not in an object", ref, tok)
		}
		if node, ok = m[tok]; !ok {
			return nil, fmt.Errorf("$ref %q: no %q", ref, tok)
		}
	}
	return node, nil
}

func (v *validator) validate(path string, schema, inst any) []string {
	at := path
	if at == "" {
		at = "/"
	}
	fail := func(format string, args ...any) []string {
		return []string{at + ": " + fmt.Sprintf(format, args...)}
	}
	switch s := schema.(type) {
	case bool:
		if !s {
			return fail("not allowed")
		}
		return nil
	case map[string]any:
		var problems []string
		for _, kw := range slices.Sorted(maps.Keys(s)) {
			problems = append(problems, v.keyword(path, at, kw, s, inst)...)
		}
		return problems
	default:
		return fail("schema is a %T", schema)
	}
}

func (v *validator) keyword(path, at, kw string, s map[string]any, inst any) []string {
	fail := func(format string, args ...any) []string {
		return []string{at + ": " + fmt.Sprintf(format, args...)}
	}
	val := s[kw]
	obj, isObj := inst.(map[string]any)
	str, isStr := inst.(string)
	num, isNum := inst.(json.Number)
	switch kw {
	case "$schema", "$id", "$defs", "title", "description":
		return nil // annotations: they constrain nothing
	case "$ref":
		target, err := v.resolve(val.(string))
		if err != nil {
			return fail("%v", err)
		}
		return v.validate(path, target, inst)
	case "type":
		var types []string
		switch t := val.(type) {
		case string:
			types = []string{t}
		case []any:
			for _, x := range t {
				types = append(types, x.(string))
			}
		}
		if !slices.ContainsFunc(types, func(t string) bool { return hasType(inst, t) }) {
			return fail("is %s, want %s", jsonKind(inst), strings.Join(types, " or "))
		}
	case "enum":
		for _, e := range val.([]any) {
			if jsonEqual(e, inst) {
				return nil
			}
		}
		return fail("%s is not one of %s", compact(inst), compact(val))
	case "required":
		if !isObj {
			return nil
		}
		var problems []string
		for _, r := range val.([]any) {
			if _, ok := obj[r.(string)]; !ok {
				problems = append(problems, fmt.Sprintf("%s: %q is required", at, r))
			}
		}
		return problems
	case "properties":
		if !isObj {
			return nil
		}
		var problems []string
		props := val.(map[string]any)
		for _, name := range slices.Sorted(maps.Keys(props)) {
			if x, ok := obj[name]; ok {
				problems = append(problems, v.validate(path+"/"+name, props[name], x)...)
			}
		}
		return problems
	case "additionalProperties":
		if !isObj {
			return nil
		}
		props, _ := s["properties"].(map[string]any)
		var problems []string
		for _, name := range slices.Sorted(maps.Keys(obj)) {
			if _, declared := props[name]; declared {
				continue
			}
			if b, ok := val.(bool); ok && !b {
				problems = append(problems, fmt.Sprintf("%s: unknown property %q", at, name))
				continue
			}
			problems = append(problems, v.validate(path+"/"+name, val, obj[name])...)
		}
		return problems
	case "maxProperties":
		if isObj && len(obj) > asInt(val) {
			return fail("has %d properties, limit is %d", len(obj), asInt(val))
		}
	case "items":
		arr, ok := inst.([]any)
		if !ok {
			return nil
		}
		var problems []string
		for i, x := range arr {
			problems = append(problems, v.validate(path+"/"+strconv.Itoa(i), val, x)...)
		}
		return problems
	case "pattern":
		if isStr && !regexp.MustCompile(val.(string)).MatchString(str) {
			return fail("%q does not match %s", str, val)
		}
	case "minLength":
		if isStr && utf8.RuneCountInString(str) < asInt(val) {
			return fail("is shorter than %d characters", asInt(val))
		}
	case "maxLength":
		if isStr && utf8.RuneCountInString(str) > asInt(val) {
			return fail("is longer than %d characters", asInt(val))
		}
	case "minimum":
		if isNum && asFloat(num) < asFloat(val.(json.Number)) {
			return fail("%s is less than %s", num, val)
		}
	case "maximum":
		if isNum && asFloat(num) > asFloat(val.(json.Number)) {
			return fail("%s is more than %s", num, val)
		}
	case "format":
		if val != "date-time" {
			return fail("the test validator does not know format %q", val)
		}
		if isStr {
			if _, err := time.Parse(time.RFC3339Nano, str); err != nil {
				return fail("%q is not a date-time: %v", str, err)
			}
		}
	default:
		return fail("the test validator does not know keyword %q", kw)
	}
	return nil
}

func hasType(inst any, t string) bool {
	switch t {
	case "object":
		_, ok := inst.(map[string]any)
		return ok
	case "array":
		_, ok := inst.([]any)
		return ok
	case "string":
		_, ok := inst.(string)
		return ok
	case "boolean":
		_, ok := inst.(bool)
		return ok
	case "null":
		return inst == nil
	case "number":
		_, ok := inst.(json.Number)
		return ok
	case "integer":
		n, ok := inst.(json.Number)
		if !ok {
			return false
		}
		if _, err := n.Int64(); err == nil {
			return true
		}
		f, err := n.Float64()
		return err == nil && f == math.Trunc(f) && !math.IsInf(f, 0)
	}
	return false
}

func jsonKind(inst any) string {
	switch x := inst.(type) {
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
	case json.Number:
		if hasType(x, "integer") {
			return "integer"
		}
		return "number"
	}
	return fmt.Sprintf("%T", inst)
}

func jsonEqual(a, b any) bool {
	an, aok := a.(json.Number)
	bn, bok := b.(json.Number)
	if aok && bok {
		return asFloat(an) == asFloat(bn)
	}
	return reflect.DeepEqual(a, b)
}

func asInt(v any) int {
	n, err := v.(json.Number).Int64()
	if err != nil {
		panic(err)
	}
	return int(n)
}

func asFloat(n json.Number) float64 {
	f, err := n.Float64()
	if err != nil {
		panic(err)
	}
	return f
}

func compact(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
