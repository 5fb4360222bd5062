package prompt

import (
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// A template's xml takes a string enum as it takes a string: the default
// template escapes the run's rung (an events.Rung) with it.
func TestXMLTakesStringEnums(t *testing.T) {
	tmpl, err := Parse(`<i rung="{{xml .Rung}}">{{xml .Text}}</i>`)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	data := struct {
		Rung events.Rung
		Text string
	}{events.RungPivot, "a<b"}
	if err := tmpl.Execute(&b, data); err != nil {
		t.Fatal(err)
	}
	if got, want := b.String(), `<i rung="PIVOT">a&lt;b</i>`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if _, err := xmlFunc(3); err == nil {
		t.Fatal("xml of a number did not fail")
	}
}
