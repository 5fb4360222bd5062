package prompt

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dispatchmesh/dispatchmesh/internal/core/xmltext"
)

// escape makes s safe as XML character data or as an attribute value:
// &, <, >, " and ' become entities, \r becomes &#xD;, invalid UTF-8 and
// characters XML forbids become U+FFFD; newlines and tabs stay literal so
// multi-line error output stays readable for the model.
func escape(s string) string { return xmltext.Escape(s, xmltext.Quoted) }

// payloadText returns the payload JSON as template text. It is verbatim
// unless it holds <, > or &, which json.HTMLEscape turns into \u003c, \u003e
// and \u0026, or characters XML cannot carry (invalid UTF-8, U+FFFE, U+FFFF),
// which become \ufffd, \ufffe and \uffff escapes. Such characters can only
// occur inside JSON strings, so the result is always the same JSON value
// (invalid UTF-8 decodes to U+FFFD either way) and cannot break the XML
// around it.
func payloadText(p json.RawMessage) string {
	if len(p) == 0 {
		return ""
	}
	if !bytes.ContainsAny(p, "<>&") && !needsPayloadFix(p) {
		return string(p)
	}
	var buf bytes.Buffer
	json.HTMLEscape(&buf, p)
	src := buf.Bytes()
	var b strings.Builder
	b.Grow(len(src))
	for i := 0; i < len(src); {
		r, width := utf8.DecodeRune(src[i:])
		switch {
		case r == utf8.RuneError && width == 1:
			b.WriteString(`\ufffd`)
		case !xmltext.Char(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.Write(src[i : i+width])
		}
		i += width
	}
	return b.String()
}

func needsPayloadFix(p []byte) bool {
	for i := 0; i < len(p); {
		r, width := utf8.DecodeRune(p[i:])
		if r == utf8.RuneError && width == 1 || !xmltext.Char(r) {
			return true
		}
		i += width
	}
	return false
}
