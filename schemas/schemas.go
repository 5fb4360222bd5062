// Package schemas holds the JSON Schemas (draft 2020-12) of every public
// dispatchmesh message, embedded in the binary. They are the contract for
// clients that are not written in Go. Each file is named by the versioned
// event name it describes (task.queued.v1 → task.queued.v1.json), plus
// task_state.v1 (the task-state KV value) and model_result.v1 (the structured
// answer the model is asked to return). Every file is self-contained: shared
// definitions are repeated in its $defs, so one file is all a validator needs.
//
// The tests of this package compare every schema with the Go type in package
// events it describes, so the two cannot drift apart.
package schemas

import (
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strings"
)

//go:embed *.json
var files embed.FS

const ext = ".json"

// Get returns the schema of the named message, e.g. "task.queued.v1". An
// unknown name is an error that matches fs.ErrNotExist.
func Get(name string) ([]byte, error) {
	if name == "" || strings.ContainsAny(name, `/\`) {
		return nil, fmt.Errorf("schemas: %q: %w", name, fs.ErrNotExist)
	}
	b, err := files.ReadFile(name + ext)
	if err != nil {
		return nil, fmt.Errorf("schemas: %q: %w", name, fs.ErrNotExist)
	}
	return b, nil
}

// Names lists the names of every schema, sorted.
func Names() []string {
	entries, err := files.ReadDir(".")
	if err != nil {
		panic("schemas: reading the embedded files: " + err.Error()) // cannot happen: embed.FS always has "."
	}
	var names []string
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ext); ok && !e.IsDir() {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// FS returns the schema files (name.json at the root), read-only.
func FS() fs.FS { return files }
