package prompt

import (
	"fmt"
	"reflect"
	"sync"
	"text/template"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// DefaultTemplate renders the user message of a task type whose policy sets
// no template. A policy template gets the same Data and the same functions:
// xml escapes a string for XML text or an attribute value (Data's Context,
// PreviousStep, Note and PreviousAttempts are escaped already; Task fields
// are not). A task's step is named only in a
// pipeline: "execute", the one step of every other task, tells the model
// nothing.
const DefaultTemplate = `<task type="{{xml .Task.Type}}" subject="{{xml .Task.Subject}}"
{{- with .Run.Step}}{{if ne . "` + events.StepExecute + `"}} step="{{xml .}}"{{end}}{{end}}>
{{- with .Payload}}
<payload>{{.}}</payload>
{{- end}}
</task>
{{- with .PreviousStep}}
<previous_step>{{.}}</previous_step>
{{- end}}
{{- with .PreviousAttempts}}
{{.}}
{{- end}}
{{- with .Context}}
<last_error>{{.}}</last_error>
{{- end}}
{{- with .Note}}
<reviewer_note>{{.}}</reviewer_note>
{{- end}}
{{- with .DeadEnds}}
{{.}}
{{- end}}
{{- with .RungInstructions}}
<instructions rung="{{xml $.Run.Rung}}">{{.}}</instructions>
{{- end}}
{{- with .PreCommit}}
<pre_commit>{{.}}</pre_commit>
{{- end}}
`

// funcs are the functions every prompt template can call.
var funcs = template.FuncMap{"xml": xmlFunc}

// xmlFunc is the templates' xml: escape for a string or a string enum
// (events.Rung, events.Status, …).
func xmlFunc(v any) (string, error) {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.String {
		return "", fmt.Errorf("xml: want a string, got %T", v)
	}
	return escape(rv.String()), nil
}

// Parse parses a prompt template with the functions prompt templates get.
// Executing it with a field Data does not have is an error.
func Parse(text string) (*template.Template, error) {
	return template.New("prompt").Funcs(funcs).Option("missingkey=error").Parse(text)
}

// templates caches parsed templates by their text. The policy can change
// while the mesh runs, so the text, not the task type, is the key; a text
// that does not parse is cached with its error, which never changes either.
type templates struct {
	m sync.Map // text → parsed
}

type parsed struct {
	t   *template.Template
	err error
}

// get returns the parsed template for text ("" means DefaultTemplate).
func (c *templates) get(text string) (*template.Template, error) {
	if text == "" {
		text = DefaultTemplate
	}
	if v, ok := c.m.Load(text); ok {
		p := v.(parsed)
		return p.t, p.err
	}
	t, err := Parse(text)
	if err != nil {
		err = fmt.Errorf("parse template: %w", err)
	}
	v, _ := c.m.LoadOrStore(text, parsed{t: t, err: err})
	p := v.(parsed)
	return p.t, p.err
}
