package schemas_test

import (
	"encoding/json"
	"fmt"
	opswhatif "github.com/dispatchmesh/dispatchmesh/internal/ops/whatif"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/schemas"
	trustpkg "github.com/dispatchmesh/dispatchmesh/trust"
)

// modelResult is the structured answer the model is asked to return
// (schema model_result.v1). The executor owns the real type; this one states
// the contract the schema must keep.
type modelResult = struct {
	Status   string   `json:"status"`
	Approach string   `json:"approach"`
	Summary  string   `json:"summary,omitempty"`
	Changes  []string `json:"changes,omitempty"`
}

// messages maps every schema to the Go type it describes.
var messages = []struct {
	name  string
	value any
}{
	{events.EventSubmit, events.Submit{}},
	{events.EventQueued, events.Queued{}},
	{events.EventIndexed, events.IndexEntry{}},
	{events.EventRetry, events.Retry{}},
	{events.EventVerified, events.Verified{}},
	{events.EventCancelled, events.Cancelled{}},
	{events.EventAdmitted, events.Admitted{}},
	{events.EventHeld, events.Held{}},
	{events.EventPrompted, events.Prompted{}},
	{events.EventExecuted, events.Executed{}},
	{events.EventSucceeded, events.Succeeded{}},
	{events.EventGated, events.Gated{}},
	{events.EventEscalated, events.Escalated{}},
	{events.EventStuck, events.Stuck{}},
	{events.EventAction, events.Action{}},
	{events.EventWebhookDue, events.WebhookDue{}},
	{events.EventWebhookTry, events.WebhookTry{}},
	{events.EventWebhookDelivered, events.WebhookDelivered{}},
	{events.EventWebhookFailed, events.WebhookFailed{}},
	{"task_state.v1", events.TaskState{}},
	{"model_result.v1", modelResult{}},
	{"api.request.v1", events.TaskRequest{}},
	{"api.submit.reply.v1", events.SubmitReply{}},
	{"api.wait.reply.v1", events.WaitReply{}},
	{"api.error.v1", events.ErrorReply{}},
	{trustpkg.EventOutcome, trustpkg.Outcome{}},
	{"whatif.report.v1", opswhatif.Result{}},
}

// TestSchemasMatchGoTypes is the drift test: every JSON field the Go type
// encodes is a schema property of a compatible type and the other way round,
// recursively; required lists exactly the fields the encoder always writes.
func TestSchemasMatchGoTypes(t *testing.T) {
	for _, m := range messages {
		t.Run(m.name, func(t *testing.T) {
			v, err := loadSchema(m.name)
			if err != nil {
				t.Fatal(err)
			}
			d := &drift{v: v}
			d.compare(m.name, reflect.TypeOf(m.value), v.root)
			for _, p := range d.problems {
				t.Error(p)
			}
		})
	}
}

func TestEverySchemaHasAGoType(t *testing.T) {
	var covered []string
	for _, m := range messages {
		covered = append(covered, m.name)
	}
	for _, name := range schemas.Names() {
		if !slices.Contains(covered, name) {
			t.Errorf("schema %s has no Go type in the drift table", name)
		}
	}
}

func loadSchema(name string) (*validator, error) {
	b, err := schemas.Get(name)
	if err != nil {
		return nil, err
	}
	v, err := newValidator(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return v, nil
}

type drift struct {
	v        *validator
	problems []string
}

func (d *drift) errorf(path, format string, args ...any) {
	d.problems = append(d.problems, path+": "+fmt.Sprintf(format, args...))
}

var (
	rawMessageType = reflect.TypeFor[json.RawMessage]()
	timeType       = reflect.TypeFor[time.Time]()
	marshalerType  = reflect.TypeFor[json.Marshaler]()
)

// node resolves $ref chains and returns the schema object at path.
func (d *drift) node(path string, schema any) (map[string]any, bool) {
	for range 16 {
		m, ok := schema.(map[string]any)
		if !ok {
			d.errorf(path, "schema is %s, want an object", compact(schema))
			return nil, false
		}
		ref, ok := m["$ref"].(string)
		if !ok {
			return m, true
		}
		target, err := d.v.resolve(ref)
		if err != nil {
			d.errorf(path, "%v", err)
			return nil, false
		}
		schema = target
	}
	d.errorf(path, "$ref chain too long")
	return nil, false
}

// schemaTypes is the schema's "type" as a sorted list (nil: any type).
func schemaTypes(n map[string]any) []string {
	switch t := n["type"].(type) {
	case string:
		return []string{t}
	case []any:
		var ts []string
		for _, x := range t {
			ts = append(ts, fmt.Sprint(x))
		}
		slices.Sort(ts)
		return ts
	}
	return nil
}

func (d *drift) wantType(path string, n map[string]any, typ reflect.Type, want string) bool {
	got := schemaTypes(n)
	if !slices.Equal(got, []string{want}) {
		d.errorf(path, "schema type is %v, Go %s encodes as %q", got, typ, want)
		return false
	}
	if enum, ok := n["enum"].([]any); ok {
		for _, e := range enum {
			if !hasType(e, want) {
				d.errorf(path, "enum value %s is not a %s", compact(e), want)
			}
		}
	}
	return true
}

func (d *drift) compare(path string, typ reflect.Type, schema any) {
	n, ok := d.node(path, schema)
	if !ok {
		return
	}
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	switch {
	case typ == rawMessageType:
		if ts := schemaTypes(n); ts != nil {
			d.errorf(path, "Go %s holds any JSON, schema restricts it to %v", typ, ts)
		}
		return
	case typ == timeType:
		if d.wantType(path, n, typ, "string") && n["format"] != "date-time" {
			d.errorf(path, `Go time.Time is a date-time, schema format is %v`, n["format"])
		}
		return
	case typ.Implements(marshalerType) || reflect.PointerTo(typ).Implements(marshalerType):
		d.errorf(path, "Go %s has its own MarshalJSON: teach the drift test its JSON shape", typ)
		return
	}
	switch typ.Kind() {
	case reflect.String:
		d.wantType(path, n, typ, "string")
	case reflect.Bool:
		d.wantType(path, n, typ, "boolean")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		d.wantType(path, n, typ, "integer")
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if d.wantType(path, n, typ, "integer") {
			if m, ok := n["minimum"].(json.Number); !ok || asFloat(m) < 0 {
				d.errorf(path, "Go %s is unsigned, schema needs minimum >= 0", typ)
			}
		}
	case reflect.Float32, reflect.Float64:
		d.wantType(path, n, typ, "number")
	case reflect.Interface:
		if ts := schemaTypes(n); ts != nil {
			d.errorf(path, "Go %s holds any JSON, schema restricts it to %v", typ, ts)
		}
	case reflect.Slice, reflect.Array:
		if typ.Elem().Kind() == reflect.Uint8 && typ.Kind() == reflect.Slice {
			d.wantType(path, n, typ, "string") // base64
			return
		}
		if d.wantType(path, n, typ, "array") {
			items, ok := n["items"]
			if !ok {
				d.errorf(path, "array schema has no items")
				return
			}
			d.compare(path+"[]", typ.Elem(), items)
		}
	case reflect.Map:
		if typ.Key().Kind() != reflect.String {
			d.errorf(path, "Go %s: the drift test only knows string-keyed maps", typ)
			return
		}
		if !d.wantType(path, n, typ, "object") {
			return
		}
		if _, ok := n["properties"]; ok {
			d.errorf(path, "Go %s is a map, schema declares fixed properties", typ)
		}
		values, ok := n["additionalProperties"]
		if !ok {
			d.errorf(path, "Go %s is a map, schema does not say what its values are (additionalProperties)", typ)
			return
		}
		d.compare(path+"{}", typ.Elem(), values)
	case reflect.Struct:
		if d.wantType(path, n, typ, "object") {
			d.compareStruct(path, typ, n)
		}
	default:
		d.errorf(path, "Go %s: the drift test does not know kind %s", typ, typ.Kind())
	}
}

func (d *drift) compareStruct(path string, typ reflect.Type, n map[string]any) {
	fields := jsonFields(typ)
	props, _ := n["properties"].(map[string]any)
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		f := fields[name]
		p, ok := props[name]
		if !ok {
			d.errorf(path+"."+name, "Go field %s.%s is not in the schema", typ, f.goName)
			continue
		}
		d.compare(path+"."+name, f.typ, p)
	}
	for _, name := range slices.Sorted(maps.Keys(props)) {
		if _, ok := fields[name]; !ok {
			d.errorf(path+"."+name, "schema property has no field in Go %s", typ)
		}
	}
	if n["additionalProperties"] != false {
		d.errorf(path, "schema of Go %s must say additionalProperties: false", typ)
	}
	var required []string
	if r, ok := n["required"].([]any); ok {
		for _, x := range r {
			required = append(required, fmt.Sprint(x))
		}
	}
	for _, name := range required {
		f, ok := fields[name]
		switch {
		case !ok:
			d.errorf(path+"."+name, "required by the schema, no such field in Go %s", typ)
		case f.optional:
			d.errorf(path+"."+name, "required by the schema, but Go omits %s.%s when empty", typ, f.goName)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		if f := fields[name]; !f.optional && !slices.Contains(required, name) {
			d.errorf(path+"."+name, "Go always writes %s.%s, schema does not require it", typ, f.goName)
		}
	}
}

type jsonField struct {
	goName   string
	typ      reflect.Type
	optional bool // the encoder may leave it out
}

// jsonFields lists the fields encoding/json writes for a struct, by JSON
// name, flattening embedded structs that have no name in their tag.
func jsonFields(typ reflect.Type) map[string]jsonField {
	fields := make(map[string]jsonField)
	for i := range typ.NumField() {
		sf := typ.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		ft := sf.Type
		if sf.Anonymous && name == "" {
			et := ft
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for n, f := range jsonFields(et) {
					if _, shadowed := fields[n]; !shadowed {
						fields[n] = f
					}
				}
				continue
			}
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		optional := false
		for o := range strings.SplitSeq(opts, ",") {
			switch o {
			case "omitzero":
				optional = true
			case "omitempty":
				optional = canBeEmpty(ft)
			case "string":
				panic("drift test: the ,string option is not supported (" + typ.String() + "." + sf.Name + ")")
			}
		}
		fields[name] = jsonField{goName: sf.Name, typ: ft, optional: optional}
	}
	return fields
}

// canBeEmpty reports whether omitempty can leave a value of t out; it never
// leaves out a struct.
func canBeEmpty(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Struct:
		return false
	case reflect.Array:
		return t.Len() == 0
	}
	return true
}
