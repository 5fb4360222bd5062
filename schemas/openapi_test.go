package schemas_test

import (
	"encoding/json"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/web"
)

// openAPIFile is the client HTTP API's OpenAPI document.
const openAPIFile = "openapi/api.v1.json"

// The OpenAPI document of the client HTTP API names exactly the routes
// internal/ops/web serves, and every body it describes is a schema of this
// directory checked against its Go type (drift, as for the NATS API), or
// one of its own components, checked the same way: web.CancelReply, and
// events.ErrorReply for the codes only HTTP has.
func TestOpenAPIMatchesGoTypes(t *testing.T) {
	b, err := os.ReadFile(openAPIFile)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := newValidator(b)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := doc.root["openapi"].(string); !strings.HasPrefix(v, "3.") {
		t.Fatalf("openapi %q, want 3.x", v)
	}
	types := map[string]reflect.Type{
		"../submit.v1.json":                reflect.TypeFor[events.Submit](),
		"../api.submit.reply.v1.json":      reflect.TypeFor[events.SubmitReply](),
		"../task_state.v1.json":            reflect.TypeFor[events.TaskState](),
		"../api.wait.reply.v1.json":        reflect.TypeFor[events.WaitReply](),
		"../api.error.v1.json":             reflect.TypeFor[events.ErrorReply](),
		"#/components/schemas/CancelReply": reflect.TypeFor[web.CancelReply](),
		"#/components/schemas/HTTPError":   reflect.TypeFor[events.ErrorReply](),
	}
	check := func(where string, ref string) {
		t.Helper()
		typ, ok := types[ref]
		if !ok {
			t.Errorf("%s: $ref %q is not a schema with a Go type", where, ref)
			return
		}
		var d *drift
		var node any
		if local, ok := strings.CutPrefix(ref, "#"); ok {
			n, err := doc.resolve("#" + local)
			if err != nil {
				t.Fatal(err)
			}
			d, node = &drift{v: doc}, n
		} else {
			v, err := loadSchema(strings.TrimSuffix(strings.TrimPrefix(ref, "../"), ".json"))
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			d, node = &drift{v: v}, v.root
		}
		d.compare(where, typ, node)
		for _, p := range d.problems {
			t.Error(p)
		}
	}
	refs := func(schema map[string]any) []string {
		if r, ok := schema["$ref"].(string); ok {
			return []string{r}
		}
		var out []string
		for _, alt := range schema["oneOf"].([]any) {
			out = append(out, alt.(map[string]any)["$ref"].(string))
		}
		return out
	}
	var routes []string
	paths := doc.root["paths"].(map[string]any)
	for path, item := range paths {
		for method, op := range item.(map[string]any) {
			routes = append(routes, strings.ToUpper(method)+" "+path)
			op := op.(map[string]any)
			if rb, ok := op["requestBody"].(map[string]any); ok && path == "/api/v1/tasks" {
				for _, r := range refs(rb["content"].(map[string]any)["application/json"].(map[string]any)["schema"].(map[string]any)) {
					check(method+" "+path+" request", r)
				}
			}
			for code, resp := range op["responses"].(map[string]any) {
				n, err := strconv.Atoi(code)
				if err != nil || http.StatusText(n) == "" {
					t.Errorf("%s %s: response %q is not an HTTP status", method, path, code)
				}
				schema := resp.(map[string]any)["content"].(map[string]any)["application/json"].(map[string]any)["schema"].(map[string]any)
				for _, r := range refs(schema) {
					if n >= 400 && r != "../api.error.v1.json" && r != "#/components/schemas/HTTPError" {
						t.Errorf("%s %s %s: an error answer is not the error object", method, path, code)
					}
					check(method+" "+path+" "+code, r)
				}
			}
		}
	}
	slices.Sort(routes)
	want := []string{"GET /api/v1/tasks/{id}", "POST /api/v1/tasks", "POST /api/v1/tasks/{id}/cancel"}
	if !slices.Equal(routes, want) {
		t.Errorf("routes %q, want %q (internal/ops/web/client.go)", routes, want)
	}
	// The HTTP-only codes and the NATS API's are apart and together every
	// code an error answer may carry.
	raw, _ := json.Marshal(doc.root["components"].(map[string]any)["schemas"].(map[string]any)["HTTPError"])
	if !strings.Contains(string(raw), `"enum":[401,413]`) {
		t.Errorf("HTTPError codes: %s, want 401 and 413", raw)
	}
}
