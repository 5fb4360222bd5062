package verifier

import (
	"encoding/json"
	"errors"
	"testing"
)

func FuzzDecodeReply(f *testing.F) {
	for _, seed := range []string{
		`{"exists": true, "detail": "still red"}`,
		`{"exists": false}`,
		`{"exists": "yes"}`,
		`{"detail": "x"}`,
		`{"exists": true}}`,
		`{"exists": true} {"exists": false}`,
		`[true]`, `null`, `true`, ``, `yes`, "\xff",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		exists, detail, err := decodeReply(data)
		if err != nil {
			if !errors.Is(err, ErrBadReply) {
				t.Fatalf("error %v does not wrap ErrBadReply", err)
			}
			if exists || detail != "" {
				t.Fatalf("error with a result: %v %q", exists, detail)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		if len(detail) > MaxDetail {
			t.Fatalf("detail is %d bytes", len(detail))
		}
		var r struct{ Exists bool }
		if err := json.Unmarshal(data, &r); err != nil || r.Exists != exists {
			t.Fatalf("exists = %v, json.Unmarshal says %v (%v)", exists, r.Exists, err)
		}
	})
}
