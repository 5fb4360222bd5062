package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Key is the key of the policy in its KV bucket (services.BucketPolicy,
// dispatch_policy). Its revision — the sequence of the put on the bucket's
// stream — names the policy everywhere: every task event carries the one it
// was decided under (events.Base.PolicyRev), and the bucket keeps every
// revision, so dispatch rebuild can read the policy of the time.
const Key = "current"

// ShadowKey is the shadow policy's key in the same bucket: a candidate every
// gate and recorder decision is also computed under, never enforced
// (dispatch policy shadow).
const ShadowKey = "shadow"

// ErrTemplateFile rejects a policy in the bucket that names a template file:
// a file on whose disk? Templates are inlined when a file seeds the bucket
// (dispatch up, dispatch policy set).
var ErrTemplateFile = errors.New("template_file is not allowed in the bucket: inline the template (dispatch policy set does)")

// Decode reads a policy as stored in the bucket: a policy file (Parse: JSON,
// unknown fields rejected, every problem reported) whose templates are
// inline. Anyone with write access can put bytes there (`nats kv put`), so
// this is outside input: whatever it refuses leaves the policy in force
// unchanged.
func Decode(data []byte) (*File, error) {
	f, errs := parse(data)
	if f != nil { // what decoded: its template files are problems too
		if f.Defaults.TemplateFile != "" {
			errs = append(errs, fmt.Errorf("defaults: %w", ErrTemplateFile))
		}
		for _, name := range slices.Sorted(maps.Keys(f.Types)) {
			if f.Types[name].TemplateFile != "" {
				errs = append(errs, fmt.Errorf("types.%s: %w", name, ErrTemplateFile))
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return f, nil
}

// Encode is what the bucket stores for f: indented JSON, so that
// `nats kv get dispatch_policy current` is readable. f must be inline.
func Encode(f *File) ([]byte, error) {
	if f == nil {
		f = &File{}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(f); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if _, err := Decode(buf.Bytes()); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// LoadInline reads a policy file like Load and inlines its template files,
// ready for the bucket.
func LoadInline(path string) (*File, error) {
	f, err := Load(path)
	if err != nil {
		return nil, err
	}
	f.Defaults.TemplateFile = ""
	for name, t := range f.Types {
		t.TemplateFile = ""
		f.Types[name] = t
	}
	return f, nil
}
