package web

import (
	"encoding/json"
	"maps"
	"slices"

	"github.com/dispatchmesh/dispatchmesh/internal/core/policy"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/review"
)

// shadowView is the queue page's shadow policy section (templates/shadow.html):
// the shadow policy's revision and, per task type the page shows, the
// policy fields it sets otherwise than the policy in force.
type shadowView struct {
	Rev   uint64
	Types []shadowType
}

type shadowType struct {
	Type   string
	Fields []string
}

// shadow is the section, nil when there is no shadow policy.
func (h *Handler) shadow(types []string) *shadowView {
	snap := h.cfg.Shadow.Snapshot()
	if h.cfg.Shadow == nil || snap.File == nil {
		return nil
	}
	live := h.cfg.Policy
	v := &shadowView{Rev: snap.Rev}
	for _, t := range types {
		if f := differing(live.For(t), snap.For(t)); len(f) > 0 {
			v.Types = append(v.Types, shadowType{Type: t, Fields: f})
		}
	}
	return v
}

// differing lists the policy fields (their JSON names) a and b set
// differently.
func differing(a, b policy.Type) []string {
	var ma, mb map[string]any
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	_ = json.Unmarshal(ja, &ma)
	_ = json.Unmarshal(jb, &mb)
	var out []string
	for _, k := range slices.Sorted(maps.Keys(mb)) {
		x, _ := json.Marshal(ma[k])
		y, _ := json.Marshal(mb[k])
		if string(x) != string(y) {
			out = append(out, k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(ma)) {
		if _, ok := mb[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// trustTypes are the types of the page's trust table.
func trustTypes(tr []review.TrustView) []string {
	out := make([]string, len(tr))
	for i, t := range tr {
		out[i] = t.Type
	}
	return out
}
