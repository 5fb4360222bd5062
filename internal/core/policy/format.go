package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
)

// Parse reads a policy file's bytes and validates them. It reports every
// problem at once: unknown fields (anywhere), values of the wrong type,
// type names that are not task types, and what Validate finds.
func Parse(data []byte) (*File, error) {
	f, errs := parse(data)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return f, nil
}

// parse decodes and validates a policy file, collecting every problem. The
// file it returns holds what decoded — every field but those with a value
// of the wrong type, which Validate then checks too — even when there are
// problems; nil when the bytes are not a JSON object.
func parse(data []byte) (*File, []error) {
	// The first JSON value, as a decoder reads it (trailing bytes are not
	// read, as before).
	var doc json.RawMessage
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		return nil, []error{fmt.Errorf("policy: %w", err)}
	}
	var top struct {
		Defaults json.RawMessage            `json:"defaults"`
		Types    map[string]json.RawMessage `json:"types"`
	}
	if err := json.Unmarshal(doc, &top); err != nil {
		return nil, located("policy", []error{describeDecode(err)})
	}
	var generic any
	_ = json.Unmarshal(doc, &generic) // it decoded above
	errs := unknownFields(reflect.TypeFor[File](), generic, "")

	f := &File{}
	if top.Types != nil {
		f.Types = make(map[string]Type, len(top.Types))
	}
	if len(top.Defaults) > 0 && string(top.Defaults) != "null" {
		errs = append(errs, located("defaults", decodeType(top.Defaults, &f.Defaults))...)
	}
	for _, name := range slices.Sorted(maps.Keys(top.Types)) {
		var t Type
		if raw := top.Types[name]; string(raw) != "null" {
			errs = append(errs, located("types."+name, decodeType(raw, &t))...)
		}
		f.Types[name] = t
	}
	return f, append(errs, f.problems()...)
}

// decodeType decodes one type's policy. A value of the wrong type stops
// the decoder at the first, so on failure every field is decoded on its
// own to report each problem, and t holds the fields that decode (for
// Validate to check them too).
func decodeType(raw json.RawMessage, t *Type) []error {
	err := json.Unmarshal(raw, t)
	if err == nil {
		return nil
	}
	*t = Type{}
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil {
		return []error{describeDecode(err)}
	}
	var errs []error
	good := map[string]json.RawMessage{}
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		one, _ := json.Marshal(map[string]json.RawMessage{k: fields[k]})
		var scratch Type
		if err := json.Unmarshal(one, &scratch); err != nil {
			errs = append(errs, describeDecode(err)) // names its field
			continue
		}
		good[k] = fields[k]
	}
	if len(errs) == 0 {
		return []error{describeDecode(err)}
	}
	rest, _ := json.Marshal(good)
	_ = json.Unmarshal(rest, t) // each decoded on its own
	return errs
}

// describeDecode drops what a decode error says about Go (struct and field
// names) where it can say it in the file's terms: the path of the field
// (JSON names, dotted), then what was found where what was expected.
func describeDecode(err error) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return err
	}
	what := fmt.Errorf("a JSON %s where %s is expected", te.Value, jsonKind(te.Type))
	if te.Field != "" {
		return fmt.Errorf("%s: %w", te.Field, what)
	}
	return what
}

func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return t.String()
}

func located(where string, errs []error) []error {
	out := make([]error, len(errs))
	for i, err := range errs {
		out[i] = fmt.Errorf("%s: %w", where, err)
	}
	return out
}

var (
	rawMessageType  = reflect.TypeFor[json.RawMessage]()
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
)

// unknownFields lists every key of v (a decoded JSON value) that the Go
// type t has no field for, at any depth, as the decoder matches keys
// (exactly, else case-insensitively). path locates v ("": the top).
func unknownFields(t reflect.Type, v any, path string) []error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawMessageType || reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil // any JSON (parameters), or decoded by its own rules (durations)
	}
	at := func(sub string) string {
		if path == "" {
			return sub
		}
		return path + "." + sub
	}
	var errs []error
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil // a value of the wrong type: the decoder reports it
		}
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			f, ok := jsonField(t, k)
			if !ok {
				where := "policy"
				if path != "" {
					where = path
				}
				errs = append(errs, fmt.Errorf("%s: unknown field %q", where, k))
				continue
			}
			errs = append(errs, unknownFields(f.Type, obj[k], at(jsonName(f)))...)
		}
	case reflect.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			errs = append(errs, unknownFields(t.Elem(), obj[k], at(k))...)
		}
	case reflect.Slice, reflect.Array:
		arr, ok := v.([]any)
		if !ok {
			return nil
		}
		for i, e := range arr {
			errs = append(errs, unknownFields(t.Elem(), e, fmt.Sprintf("%s[%d]", path, i))...)
		}
	}
	return errs
}

// jsonField finds the field of struct t that the decoder fills from key k.
func jsonField(t reflect.Type, k string) (reflect.StructField, bool) {
	var fold *reflect.StructField
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() || f.Tag.Get("json") == "-" {
			continue
		}
		name := jsonName(f)
		if name == k {
			return f, true
		}
		if fold == nil && strings.EqualFold(name, k) {
			fold = &f
		}
	}
	if fold != nil {
		return *fold, true
	}
	return reflect.StructField{}, false
}

func jsonName(f reflect.StructField) string {
	if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" {
		return name
	}
	return f.Name
}

// Load reads and parses a policy file; template files are read relative to
// the working directory.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := f.readTemplates(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

func (f *File) readTemplates() error {
	read := func(t *Type) error {
		if t.TemplateFile == "" {
			return nil
		}
		b, err := os.ReadFile(t.TemplateFile)
		if err != nil {
			return err
		}
		t.Template = string(b)
		return nil
	}
	if err := read(&f.Defaults); err != nil {
		return err
	}
	for name, t := range f.Types {
		if err := read(&t); err != nil {
			return err
		}
		f.Types[name] = t
	}
	return nil
}
