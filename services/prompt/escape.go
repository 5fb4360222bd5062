package prompt

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// escape makes s safe as XML character data or as an attribute value: it
// follows encoding/xml.EscapeText (&, <, >, " and ' become entities, \r
// becomes &#xD;, invalid UTF-8 and characters XML forbids become U+FFFD),
// except that newlines and tabs stay literal so that multi-line error output
// stays readable for the model. They cannot end a section either way.
func escape(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + len(s)/8)
	for i := 0; i < len(s); {
		r, width := utf8.DecodeRuneInString(s[i:])
		i += width
		switch {
		case r == utf8.RuneError && width == 1:
			b.WriteRune(utf8.RuneError)
		case r == '&':
			b.WriteString("&amp;")
		case r == '<':
			b.WriteString("&lt;")
		case r == '>':
			b.WriteString("&gt;")
		case r == '"':
			b.WriteString("&#34;")
		case r == '\'':
			b.WriteString("&#39;")
		case r == '\r':
			b.WriteString("&#xD;")
		case !xmlChar(r):
			b.WriteRune(utf8.RuneError)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func needsEscape(s string) bool {
	for i := 0; i < len(s); {
		r, width := utf8.DecodeRuneInString(s[i:])
		i += width
		switch {
		case r == utf8.RuneError && width == 1, r == '&', r == '<', r == '>', r == '"', r == '\'', r == '\r', !xmlChar(r):
			return true
		}
	}
	return false
}

// xmlChar reports whether r may appear in an XML document (the Char
// production of XML 1.0), the same test encoding/xml applies.
func xmlChar(r rune) bool {
	return r == '\t' || r == '\n' || r == '\r' ||
		r >= 0x20 && r <= 0xD7FF ||
		r >= 0xE000 && r <= 0xFFFD ||
		r >= 0x10000 && r <= 0x10FFFF
}

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
		case !xmlChar(r):
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
		if r == utf8.RuneError && width == 1 || !xmlChar(r) {
			return true
		}
		i += width
	}
	return false
}
