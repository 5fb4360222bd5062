package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth bounds how deeply a submission nests objects and arrays; the
// submission object itself is level 1, so its payload may nest 63 levels.
// Every event that carries a task nests it two levels deeper, and Go's
// decoder refuses more than 10000 levels: a limit far below that keeps every
// later stage able to decode what intake accepted.
const MaxDepth = 64

// MaxIDScanBytes is how much of a message scanSubmit reads: an oversized
// submission is kept under its "id" when the id comes within this prefix.
const MaxIDScanBytes = 1 << 20

// scanSubmit reads the JSON tokens of a submission for what the decoder
// would pass on but a later stage refuses or silently changes. deep says
// where the message nests deeper than MaxDepth (the scan stops there);
// problems name each top-level field holding a string that is not valid
// UTF-8 (the decoder replaces such bytes, and UTF-16 surrogate escapes
// without their pair, with U+FFFD). id is the top-level "id" string, read
// even when the rest of the message is bad, so a rejection can be kept
// under it. The scan stops at the first syntax error (DecodeSubmit reports
// it) and reads at most MaxIDScanBytes.
func scanSubmit(data []byte) (id, deep string, problems []string) {
	if len(data) > MaxIDScanBytes {
		data = data[:MaxIDScanBytes]
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct{ object, wantKey bool }
	var stack []frame
	field := ""                   // the top-level field being read
	reported := map[string]bool{} // one UTF-8 problem per top-level field
	prev := int64(0)
	for {
		tok, err := dec.Token()
		if err != nil {
			return id, "", problems // end of input, or a syntax error DecodeSubmit reports
		}
		end := dec.InputOffset()
		raw := data[prev:end]
		at := prev
		prev = end
		isKey := len(stack) > 0 && stack[len(stack)-1].object && stack[len(stack)-1].wantKey
		switch v := tok.(type) {
		case json.Delim:
			if v == '{' || v == '[' {
				if len(stack) == MaxDepth {
					deep = fmt.Sprintf("nested deeper than %d levels (at byte %d): later stages could not decode it", MaxDepth, end)
					return id, deep, problems
				}
				stack = append(stack, frame{object: v == '{', wantKey: true})
				continue // the container's value ends at its closing delimiter
			}
			stack = stack[:len(stack)-1]
		case string:
			if off, bad := badString(raw); bad {
				where := utf8Where(field, isKey, len(stack))
				if !reported[where] {
					reported[where] = true
					problems = append(problems, fmt.Sprintf("%s not valid UTF-8 (at byte %d)", where, at+int64(off)))
				}
			}
			if isKey {
				stack[len(stack)-1].wantKey = false
				if len(stack) == 1 {
					field = v
				}
				continue
			}
			if len(stack) == 1 && strings.EqualFold(field, "id") { // the decoder matches field names case-insensitively
				id = v
			}
		}
		if len(stack) == 0 {
			return id, "", problems // the message's value ended: what follows is trailing data
		}
		if stack[len(stack)-1].object {
			stack[len(stack)-1].wantKey = true // a value ended: a key comes next
		}
	}
}

// utf8Where names where a string that is not valid UTF-8 sits: the
// top-level field it is or is inside of, a field name, the message.
func utf8Where(field string, isKey bool, depth int) string {
	switch {
	case depth == 0:
		return "the message is"
	case depth == 1 && isKey:
		return "a field name is"
	case depth == 1:
		return fmt.Sprintf("%q is", field)
	}
	return fmt.Sprintf("%q holds a string that is", field)
}

// badString reports whether the JSON string token raw (after what preceded
// it since the previous token: separators, whitespace) holds something the
// decoder silently turns into U+FFFD — bytes that are not UTF-8, or a
// UTF-16 surrogate escape without its pair — and the offset in raw where
// it starts. raw is a well-formed token: the decoder returned it.
func badString(raw []byte) (int, bool) {
	for i := bytes.IndexByte(raw, '"') + 1; i < len(raw); {
		switch c := raw[i]; {
		case c == '\\' && raw[i+1] == 'u':
			r := hex4(raw[i+2 : i+6])
			switch {
			case !utf16.IsSurrogate(r):
				i += 6
			case r < 0xDC00 && i+12 <= len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' &&
				hex4(raw[i+8:i+12]) >= 0xDC00 && hex4(raw[i+8:i+12]) <= 0xDFFF:
				i += 12 // a high surrogate and its low one: one character
			default:
				return i, true
			}
		case c == '\\':
			i += 2
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && n == 1 {
				return i, true
			}
			i += n
		}
	}
	return 0, false
}

func hex4(b []byte) rune {
	n, _ := strconv.ParseUint(string(b), 16, 32)
	return rune(n)
}
