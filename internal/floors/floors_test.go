// Package floors holds the test that keeps the module's imports running
// one way: down the floors named in the table below, never up or across
// to a floor not allowed, and never from the pure core to nats.go.
package floors

import (
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/dispatchmesh/dispatchmesh"

// A floor is one layer of the module.
type floor string

const (
	contract floor = "contract" // events, schemas: the wire and its schemas
	core     floor = "core"     // internal/core: pure decisions, no I/O
	rt       floor = "runtime"  // internal/runtime: NATS and process adapters
	svc      floor = "services" // services, the stages, trust and history stores
	client   floor = "client"   // the public client
	root     floor = "root"     // internal/mesh: the composition root
	ops      floor = "ops"      // internal/ops: operator tools
	testkit  floor = "testkit"  // internal/testkit: test helpers
	bench    floor = "bench"    // internal/bench: benchmarks
	command  floor = "cmd"      // cmd: the binaries
	deploy   floor = "deploy"   // deploy: deployment files and their tests
	example  floor = "examples" // examples: programs a user would write
	check    floor = "floors"   // this test
)

// floors places every package of the module, by path below the module: an
// entry ending in "/" holds everything under it; the longest entry wins.
var floors = map[string]floor{
	"events":                         contract,
	"schemas":                        contract,
	"internal/core/":                 core,
	"internal/runtime/":              rt,
	"trust":                          svc,
	"history":                        svc,
	"services":                       svc,
	"services/":                      svc,
	"client":                         client,
	"internal/mesh":                  root,
	"internal/ops/":                  ops,
	"internal/ops/review/reviewtest": testkit,
	"internal/testkit/":              testkit,
	"internal/bench/":                bench,
	"cmd/":                           command,
	"deploy":                         deploy,
	"examples":                       example,
	"examples/":                      example,
	"internal/floors":                check,
}

// allowed lists the floors each floor's packages may import (besides the
// standard library and third-party modules). A floor not listed for itself
// may not import its own packages either.
var allowed = map[floor][]floor{
	contract: {contract},
	core:     {contract, core},
	rt:       {contract, core, rt},
	svc:      {contract, core, rt, svc},
	client:   {contract},
	root:     {contract, core, rt, svc},
	ops:      {contract, core, rt, svc, ops},
	testkit:  {contract, core, rt, svc, root, ops, testkit},
	bench:    {contract, core, rt, svc, root, testkit, bench},
	command:  {contract, core, rt, svc, client, root, ops, bench},
	deploy:   {},
	example:  {contract, client},
	check:    {},
}

// pure floors: their packages never reach a NATS module, and their tests
// keep to the same arrows as their code.
var pure = []floor{contract, core}

type pkg struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
	Deps         []string
	Error        *struct{ Err string }
}

func floorOf(path string) (floor, bool) {
	rel, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return "", false
	}
	best, found := "", false
	for k := range floors {
		match := rel == k || (strings.HasSuffix(k, "/") && strings.HasPrefix(rel, k))
		if match && len(k) > len(best) {
			best, found = k, true
		}
	}
	return floors[best], found
}

func local(path string) bool { return strings.HasPrefix(path, module+"/") }

// graph reads the module's packages as go list sees them.
func graph(t *testing.T) []pkg {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(gobin, "list", "-json", "./...")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
	touch(t, cmd.Dir)
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages: is the test running in the module?", len(pkgs))
	}
	return pkgs
}

// touch opens every directory and Go file of the module, so that go test's
// cache, which cannot see what the go list child read, reruns the test when
// any of them changes.
func touch(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || strings.HasSuffix(path, ".go") || d.Name() == "go.mod" {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			return f.Close()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk the module: %v", err)
	}
}

// TestFloors fails on a package the table does not place, an import that
// runs to a floor its floor may not import, and a pure package that
// reaches nats.go.
func TestFloors(t *testing.T) {
	for _, p := range graph(t) {
		f, ok := floorOf(p.ImportPath)
		if !ok {
			t.Errorf("%s: on no floor: add it to the table in internal/floors", p.ImportPath)
			continue
		}
		arrows := func(kind string, imports []string) {
			for _, imp := range imports {
				if !local(imp) || imp == p.ImportPath {
					continue
				}
				to, ok := floorOf(imp)
				if !ok {
					t.Errorf("%s imports %s, which is on no floor", p.ImportPath, imp)
					continue
				}
				if !slices.Contains(allowed[f], to) {
					t.Errorf("%s (%s) %simports %s (%s): %s may import only %v", p.ImportPath, f, kind, imp, to, f, allowed[f])
				}
			}
		}
		arrows("", p.Imports)
		if slices.Contains(pure, f) && f != contract {
			// A pure package's tests stay pure too. The contract's tests
			// check the schemas against the services that serve them, so
			// they, like every other floor's tests, may import any floor.
			arrows("in a test ", p.TestImports)
			arrows("in a test ", p.XTestImports)
		}
		if slices.Contains(pure, f) {
			for _, d := range p.Deps {
				if strings.HasPrefix(d, "github.com/nats-io/") {
					t.Errorf("%s (%s) reaches %s: the pure floors never reach NATS", p.ImportPath, f, d)
					break
				}
			}
		}
	}
}

// TestFloorOf pins the table's lookup: the longest entry wins and a
// package outside every entry is on no floor.
func TestFloorOf(t *testing.T) {
	for path, want := range map[string]floor{
		module + "/internal/ops/review":            ops,
		module + "/internal/ops/review/reviewtest": testkit,
		module + "/internal/core/task":             core,
		module + "/internal/runtime/tracing":       rt,
		module + "/internal/core/whatif":           core,
		module + "/internal/ops/whatif":            ops,
		module + "/services/gate":                  svc,
		module + "/services":                       svc,
		module + "/trust":                          svc,
	} {
		if got, ok := floorOf(path); !ok || got != want {
			t.Errorf("floorOf(%s) = %q, %v; want %q", path, got, ok, want)
		}
	}
	for _, path := range []string{module + "/internal/newthing", module + "/trustx", "github.com/nats-io/nats.go"} {
		if f, ok := floorOf(path); ok {
			t.Errorf("floorOf(%s) = %q; want no floor", path, f)
		}
	}
}
