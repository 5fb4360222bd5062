package services

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"

	json "github.com/go-json-experiment/json/v1"

	"github.com/dispatchmesh/dispatchmesh/events"
)

// MinStateKey is the shortest key a Sealer accepts (bytes).
const MinStateKey = 32

// MaxSealed bounds the encoded state a Sealer seals: a larger task (a big
// payload, a long attempt history) travels without it, and the executor
// reads its state.
const MaxSealed = 64 << 10

// Sealer seals a task's state for the executor (events.Sealed) and opens
// what it sealed. Only the services that seal and the executor hold its
// key: intake, the verifier and the recorder seal what they wrote, the gate
// and the prompt builder relay the seal as it came, and the executor opens it
// and starts its compare-and-set from it instead of reading. A seal the key
// does not open — forged, changed on the way, sealed with another key — is
// ignored: the executor reads, as it does without one. A nil *Sealer seals
// and opens nothing.
type Sealer struct{ key []byte }

// NewSealer returns a Sealer with key (at least MinStateKey bytes).
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) < MinStateKey {
		return nil, fmt.Errorf("state key: %d bytes, at least %d wanted", len(key), MinStateKey)
	}
	return &Sealer{key: append([]byte(nil), key...)}, nil
}

// Seal seals at, the state of task at.State.ID as stored at revision
// at.Rev. Nil without a key, without a stored revision, or for a state over
// MaxSealed.
func (s *Sealer) Seal(at events.StateAt) *events.Sealed {
	if s == nil || at.Rev == 0 {
		return nil
	}
	data, err := json.Marshal(at.State)
	if err != nil || len(data) > MaxSealed {
		return nil
	}
	return &events.Sealed{Rev: at.Rev, State: data, MAC: base64.RawURLEncoding.EncodeToString(s.mac(at.State.ID, at.Rev, data))}
}

// Open returns the state sealed in sd for task id, or nil when there is
// none the key opens: no seal, another task's, a MAC that does not match,
// a state that does not decode.
func (s *Sealer) Open(id string, sd *events.Sealed) *events.StateAt {
	if s == nil || sd == nil || sd.Rev == 0 || len(sd.State) > MaxSealed {
		return nil
	}
	got, err := base64.RawURLEncoding.DecodeString(sd.MAC)
	if err != nil {
		return nil
	}
	if !hmac.Equal(got, s.mac(id, sd.Rev, sd.State)) {
		return nil
	}
	var st events.TaskState
	if json.Unmarshal(sd.State, &st) != nil || st.ID != id {
		return nil
	}
	return &events.StateAt{Rev: sd.Rev, State: st}
}

// mac binds the state's bytes to its task and revision.
func (s *Sealer) mac(id string, rev uint64, state []byte) []byte {
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte("dispatchmesh task state v1\x00"))
	h.Write([]byte(id))
	h.Write([]byte{0})
	h.Write(strconv.AppendUint(nil, rev, 10))
	h.Write([]byte{0})
	h.Write(state)
	return h.Sum(nil)
}
