package schemas_test

import (
	"encoding/json"
	"errors"
	trustpkg "github.com/dispatchmesh/dispatchmesh/trust"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/schemas"
)

func TestGetNamesFS(t *testing.T) {
	names := schemas.Names()
	if !slices.IsSorted(names) {
		t.Errorf("Names() = %v, not sorted", names)
	}
	for _, name := range names {
		b, err := schemas.Get(name)
		if err != nil {
			t.Errorf("Get(%q): %v", name, err)
			continue
		}
		fromFS, err := fs.ReadFile(schemas.FS(), name+".json")
		if err != nil || string(fromFS) != string(b) {
			t.Errorf("FS() file %s.json differs from Get(%q) (err %v)", name, name, err)
		}
	}
	for _, bad := range []string{"", "nope.v1", "submit.v1.json", "../schemas/submit.v1", "./submit.v1", "/submit.v1"} {
		if _, err := schemas.Get(bad); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Get(%q) error = %v, want fs.ErrNotExist", bad, err)
		}
	}
}

// TestSchemaFilesAreValidJSON checks every file parses, names itself and
// declares draft 2020-12.
func TestSchemaFilesAreValidJSON(t *testing.T) {
	for _, name := range schemas.Names() {
		b, _ := schemas.Get(name)
		var s struct {
			Schema      string `json:"$schema"`
			ID          string `json:"$id"`
			Title       string `json:"title"`
			Description string `json:"description"`
		}
		if err := json.Unmarshal(b, &s); err != nil {
			t.Errorf("%s.json: %v", name, err)
			continue
		}
		if s.Schema != "https://json-schema.org/draft/2020-12/schema" {
			t.Errorf("%s.json: $schema = %q, want draft 2020-12", name, s.Schema)
		}
		if !strings.HasSuffix(s.ID, ":"+name) {
			t.Errorf("%s.json: $id = %q does not end in the schema's name", name, s.ID)
		}
		if s.Title == "" || s.Description == "" {
			t.Errorf("%s.json: needs a title and a description", name)
		}
	}
}

// TestEveryEventHasASchema reads the Event* constants from the source of
// package events, so a new event without a schema fails here.
func TestEveryEventHasASchema(t *testing.T) {
	eventNames := stringConsts(t, "Event")
	if len(eventNames) == 0 {
		t.Fatal("found no Event* constants in ../events")
	}
	// Rejected and poison records carry the original bytes, not a JSON body.
	rawBodies := []string{events.EventRejected, events.EventPoison}
	var want []string
	for constName, name := range eventNames {
		if slices.Contains(rawBodies, name) {
			continue
		}
		want = append(want, name)
		if _, err := schemas.Get(name); err != nil {
			t.Errorf("events.%s = %q has no schema: %v", constName, name, err)
		}
	}
	// And every schema is an event, or one of the non-event messages: the
	// task state, the model's answer, the request-reply API's messages, the
	// outcome stream's message (its name is package trust's), the what-if
	// report (dispatch whatif -o json).
	for _, name := range schemas.Names() {
		if !slices.Contains(want, name) && name != "task_state.v1" && name != "model_result.v1" && !strings.HasPrefix(name, "api.") &&
			name != trustpkg.EventOutcome && name != "whatif.report.v1" {
			t.Errorf("schema %s names no events.Event* constant", name)
		}
	}
}

// TestEnumsMatchConstants checks that closed sets of values in the schemas
// are the constants package events declares.
func TestEnumsMatchConstants(t *testing.T) {
	for _, c := range []struct {
		schema, pointer, constPrefix string
	}{
		{"task_state.v1", "#/properties/status", "Status"},
		{events.EventVerified, "#/$defs/verification/properties/verdict", "Verdict"},
		{events.EventCancelled, "#/$defs/verification/properties/verdict", "Verdict"},
		{events.EventExecuted, "#/$defs/result/properties/outcome", "Outcome"},
		{events.EventSucceeded, "#/$defs/result/properties/outcome", "Outcome"},
		{"model_result.v1", "#/properties/status", "Outcome"},
		{events.EventAction, "#/properties/action", "Action"},
		{"task_state.v1", "#/$defs/action/properties/action", "Action"},
		{"api.wait.reply.v1", "#/properties/status", "Status"},
	} {
		v, err := loadSchema(c.schema)
		if err != nil {
			t.Fatal(err)
		}
		node, err := v.resolve(c.pointer)
		if err != nil {
			t.Errorf("%s: %v", c.schema, err)
			continue
		}
		var enum []string
		for _, e := range node.(map[string]any)["enum"].([]any) {
			enum = append(enum, e.(string))
		}
		var consts []string
		for _, val := range stringConsts(t, c.constPrefix) {
			consts = append(consts, val)
		}
		slices.Sort(enum)
		slices.Sort(consts)
		if !slices.Equal(enum, consts) {
			t.Errorf("%s %s: enum %v, events.%s* constants %v", c.schema, c.pointer, enum, c.constPrefix, consts)
		}
	}
}

// stringConsts returns the string constants of package events whose names
// start with prefix (followed by an upper-case letter), by constant name.
func stringConsts(t *testing.T, prefix string) map[string]string {
	t.Helper()
	files, err := filepath.Glob("../events/*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	consts := make(map[string]string)
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					rest, ok := strings.CutPrefix(id.Name, prefix)
					if !ok || rest == "" || rest[0] < 'A' || rest[0] > 'Z' || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Fatalf("%s: events.%s is not a string literal", fset.Position(id.Pos()), id.Name)
					}
					consts[id.Name], _ = strconv.Unquote(lit.Value)
				}
			}
		}
	}
	return consts
}

// TestAPIErrorCodesMatchConstants: the codes api.error.v1 lists are the
// events.Code* constants, no more, no fewer.
func TestAPIErrorCodesMatchConstants(t *testing.T) {
	v, err := loadSchema("api.error.v1")
	if err != nil {
		t.Fatal(err)
	}
	node, err := v.resolve("#/properties/error/properties/code")
	if err != nil {
		t.Fatal(err)
	}
	var enum []int
	for _, e := range node.(map[string]any)["enum"].([]any) {
		n, err := e.(json.Number).Int64()
		if err != nil {
			t.Fatalf("code %v: %v", e, err)
		}
		enum = append(enum, int(n))
	}
	want := []int{events.CodeBadRequest, events.CodeNotFound, events.CodeConflict, events.CodeRejected, events.CodeInternal, events.CodeUnavailable}
	slices.Sort(enum)
	if !slices.Equal(enum, want) {
		t.Errorf("api.error.v1 codes %v, events.Code* constants %v", enum, want)
	}
}
