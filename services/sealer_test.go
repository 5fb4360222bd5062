package services_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services"
)

func sealer(t testing.TB, fill byte) *services.Sealer {
	t.Helper()
	s, err := services.NewSealer(bytes.Repeat([]byte{fill}, services.MinStateKey))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A sealed state opens with its key, for its task, after the trip through
// the events that relay it (decoded and encoded again on the way); nothing
// else opens.
func TestSealer(t *testing.T) {
	s, other := sealer(t, 1), sealer(t, 2)
	st := events.TaskState{ID: "t1", Type: "css_fix", Subject: "a<b>&c\u2028", Status: events.StatusPending, Attempts: 2,
		FailedRequests: []string{"1:abc"}, Cost: 0.25}
	at := events.StateAt{Rev: 42, State: st}
	sd := s.Seal(at)
	if sd == nil {
		t.Fatal("nothing sealed")
	}
	// Relayed: a service decodes the event and encodes it again.
	data, err := json.Marshal(events.Admitted{Sealed: sd})
	if err != nil {
		t.Fatal(err)
	}
	var relayed events.Admitted
	if err := json.Unmarshal(data, &relayed); err != nil {
		t.Fatal(err)
	}
	data, _ = json.Marshal(events.Prompted{Sealed: relayed.Sealed})
	var in events.Prompted
	if err := json.Unmarshal(data, &in); err != nil {
		t.Fatal(err)
	}
	got := s.Open("t1", in.Sealed)
	if got == nil || got.Rev != 42 || got.State.Subject != st.Subject || got.State.Attempts != 2 || got.State.Cost != 0.25 ||
		len(got.State.FailedRequests) != 1 {
		t.Fatalf("opened %+v, want %+v", got, at)
	}

	changed := func(f func(*events.Sealed)) *events.Sealed {
		c := *sd
		c.State = bytes.Clone(sd.State)
		f(&c)
		return &c
	}
	for name, tc := range map[string]struct {
		s  *services.Sealer
		id string
		sd *events.Sealed
	}{
		"another key":      {other, "t1", sd},
		"another task":     {s, "t2", sd},
		"no seal":          {s, "t1", nil},
		"no sealer":        {nil, "t1", sd},
		"another revision": {s, "t1", changed(func(c *events.Sealed) { c.Rev = 43 })},
		"a changed state": {s, "t1", changed(func(c *events.Sealed) {
			c.State = bytes.Replace(c.State, []byte(`"attempts":2`), []byte(`"attempts":0`), 1)
		})},
		"a MAC that is no MAC":  {s, "t1", changed(func(c *events.Sealed) { c.MAC = "!" })},
		"no MAC":                {s, "t1", changed(func(c *events.Sealed) { c.MAC = "" })},
		"a truncated MAC":       {s, "t1", changed(func(c *events.Sealed) { c.MAC = c.MAC[:10] })},
		"revision zero":         {s, "t1", changed(func(c *events.Sealed) { c.Rev = 0 })},
		"another task's sealed": {s, "t2", s.Seal(events.StateAt{Rev: 42, State: events.TaskState{ID: "t1"}})},
	} {
		if got := tc.s.Open(tc.id, tc.sd); got != nil {
			t.Errorf("%s: opened %+v", name, got)
		}
	}

	if sd := s.Seal(events.StateAt{State: st}); sd != nil {
		t.Error("a state with no revision sealed")
	}
	if sd := (*services.Sealer)(nil).Seal(at); sd != nil {
		t.Error("a nil Sealer sealed")
	}
	big := st
	big.LastError = strings.Repeat("x", services.MaxSealed)
	if sd := s.Seal(events.StateAt{Rev: 1, State: big}); sd != nil {
		t.Error("a state over MaxSealed sealed")
	}
	if _, err := services.NewSealer([]byte("short")); err == nil {
		t.Error("a short key accepted")
	}
}

// Whatever an event carries as its seal, Open never panics, and what it
// opens is a state of the task asked for, at the sealed revision, that
// seals again to a seal that opens.
func FuzzSealerOpen(f *testing.F) {
	s := sealer(f, 7)
	good, _ := json.Marshal(s.Seal(events.StateAt{Rev: 3, State: events.TaskState{ID: "t1", Status: events.StatusPending}}))
	f.Add("t1", good)
	f.Add("t1", []byte(`{"rev":3,"state":{"id":"t1"},"mac":"AAAA"}`))
	f.Add("t1", []byte(`{"rev":1,"state":null,"mac":""}`))
	f.Add("", []byte(`{}`))
	f.Fuzz(func(t *testing.T, id string, data []byte) {
		var sd events.Sealed
		if json.Unmarshal(data, &sd) != nil {
			return
		}
		at := s.Open(id, &sd)
		if at == nil {
			return
		}
		if at.State.ID != id || at.Rev != sd.Rev {
			t.Fatalf("opened %+v for %q from %s", at, id, data)
		}
		if again := s.Seal(*at); again == nil || s.Open(id, again) == nil {
			t.Fatalf("a state that opened does not seal again: %+v", at)
		}
	})
}
