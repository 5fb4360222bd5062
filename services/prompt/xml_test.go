package prompt

import (
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
)

// element is one element of a rendered user message.
type element struct {
	Name  string
	Attrs map[string]string
	// Text is the element's own character data, decoded.
	Text string
}

// parseUser parses a user message wrapped in <prompt>…</prompt> as strict
// XML and returns its elements in document order (the wrapper first). A
// message that is not well-formed fails the test.
func parseUser(t testing.TB, user string) []element {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader("<prompt>" + user + "</prompt>"))
	dec.Strict = true
	var all []element
	var open []int
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("user message is not well-formed XML: %v\n%s", err, user)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := element{Name: tok.Name.Local, Attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.Attrs[a.Name.Local] = a.Value
			}
			all = append(all, e)
			open = append(open, len(all)-1)
		case xml.EndElement:
			open = open[:len(open)-1]
		case xml.CharData:
			if len(open) > 0 {
				all[open[len(open)-1]].Text += string(tok)
			}
		}
	}
	return all
}

// names lists the element names, wrapper left out.
func names(es []element) []string {
	var out []string
	for _, e := range es[1:] {
		out = append(out, e.Name)
	}
	return out
}

// find returns the elements with the given name.
func find(es []element, name string) []element {
	var out []element
	for _, e := range es {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}
