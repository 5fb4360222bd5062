package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
)

// Differences lists what differs between two submissions of one id — s as
// stored, t as submitted again — one sentence each; empty when they are
// the same task. "The same" is the submitted task fields as decoded
// (DecodeSubmit), normalised:
//
//   - type (as given, or as taken from the subject it was published on),
//     subject, max_retries and priority compared as values, a field left
//     out counting as its zero (max_retries 0, priority 0);
//   - payload compared as a JSON value: white space and the order of an
//     object's keys do not count, a left-out payload is null; numbers are
//     compared as written ("1" and "1.0" differ, as a template sees them);
//   - metadata compared as a map: the order of its keys does not count, a
//     left-out metadata is {}.
//
// The id is the same by definition; nothing else (when or how it was
// sent) counts.
func (s Submit) Differences(t Submit) []string {
	var d []string
	if s.Type != t.Type {
		d = append(d, fmt.Sprintf(`"type" differs: the task has %q, this submission %q`, s.Type, t.Type))
	}
	if s.Subject != t.Subject {
		d = append(d, fmt.Sprintf(`"subject" differs: the task has %q, this submission %q`, clipText(s.Subject, 80), clipText(t.Subject, 80)))
	}
	if path, ok := sameJSON(s.Payload, t.Payload); !ok {
		where := ""
		if path != "" {
			where = " at " + path
		}
		d = append(d, `"payload" differs`+where)
	}
	if s.MaxRetries != t.MaxRetries {
		d = append(d, fmt.Sprintf(`"max_retries" differs: the task has %d, this submission %d`, s.MaxRetries, t.MaxRetries))
	}
	if s.Priority != t.Priority {
		d = append(d, fmt.Sprintf(`"priority" differs: the task has %d, this submission %d`, s.Priority, t.Priority))
	}
	if s.CallbackURL != t.CallbackURL {
		d = append(d, fmt.Sprintf(`"callback_url" differs: the task has %q, this submission %q`, clipText(s.CallbackURL, 80), clipText(t.CallbackURL, 80)))
	}
	if !maps.Equal(s.Metadata, t.Metadata) {
		var keys []string
		for k := range s.Metadata {
			if v, ok := t.Metadata[k]; !ok || v != s.Metadata[k] {
				keys = append(keys, k)
			}
		}
		for k := range t.Metadata {
			if _, ok := s.Metadata[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		quoted := make([]string, len(keys))
		for i, k := range keys {
			quoted[i] = strconv.Quote(clipText(k, 40))
		}
		d = append(d, fmt.Sprintf(`"metadata" differs at %s`, joinMax(quoted, 5)))
	}
	return d
}

// sameJSON reports whether a and b hold the same JSON value (absent or
// empty is null), and where they first differ: a path such as
// .issue.sizes[2], "" for the whole value.
func sameJSON(a, b json.RawMessage) (string, bool) {
	if bytes.Equal(a, b) {
		return "", true
	}
	va, errA := decodeNumbers(a)
	vb, errB := decodeNumbers(b)
	if errA != nil || errB != nil {
		return "", false
	}
	return diffValue("", va, vb)
}

func decodeNumbers(raw json.RawMessage) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

func diffValue(path string, a, b any) (string, bool) {
	switch a := a.(type) {
	case map[string]any:
		bm, ok := b.(map[string]any)
		if !ok {
			return path, false
		}
		keys := slices.Sorted(maps.Keys(a))
		for k := range bm {
			if _, ok := a[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			av, inA := a[k]
			bv, inB := bm[k]
			if inA != inB {
				return path + "." + k, false
			}
			if p, ok := diffValue(path+"."+k, av, bv); !ok {
				return p, false
			}
		}
		return "", true
	case []any:
		bs, ok := b.([]any)
		if !ok {
			return path, false
		}
		for i := range max(len(a), len(bs)) {
			p := fmt.Sprintf("%s[%d]", path, i)
			if i >= len(a) || i >= len(bs) {
				return p, false
			}
			if p, ok := diffValue(p, a[i], bs[i]); !ok {
				return p, false
			}
		}
		return "", true
	default:
		if a != b {
			return path, false
		}
		return "", true
	}
}

func joinMax(s []string, n int) string {
	if len(s) > n {
		return fmt.Sprintf("%s and %d more", joinComma(s[:n]), len(s)-n)
	}
	return joinComma(s)
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ", "
		}
		out += x
	}
	return out
}
