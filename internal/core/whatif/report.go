package whatif

// report tallies the tasks reported (first seen at or after Since, of
// Type when set).
func (e *engine) report() Report {
	r := Report{Since: e.o.Since, PolicyRevision: e.o.Revision, ByType: map[string]TypeReport{}, Changed: []Change{}}
	for _, tr := range e.order {
		if tr.first.Before(e.o.Since) || (e.o.Type != "" && tr.t.Type != e.o.Type) {
			continue
		}
		tb := r.ByType[tr.t.Type]
		tb.Tasks++
		r.Tasks++
		tb.Actual.add(tr.actual)
		r.Actual.add(tr.actual)
		tb.WhatIf.Figures.add(tr.wi)
		r.WhatIf.Figures.add(tr.wi)
		tb.WhatIf.Estimated.add(tr.est)
		r.WhatIf.Estimated.add(tr.est)
		r.ByType[tr.t.Type] = tb
		if tr.actual.Fate != tr.wi.Fate || tr.actual.Attempts != tr.wi.Attempts {
			cause := tr.cause
			if cause == "" {
				cause = "the types' trust moved: " + tr.wi.Decision
			}
			r.Changed = append(r.Changed, Change{ID: tr.t.ID, Type: tr.t.Type, Actual: tr.actual, WhatIf: tr.wi, Cause: cause})
		}
	}
	return r
}

func (f *Figures) add(x Fate) {
	f.Tokens += x.Tokens
	f.Cost += x.Cost
	f.Attempts += x.Attempts
	switch x.Fate {
	case FateResolved:
		f.Resolved++
	case FateToHuman:
		f.ToHuman++
	case FateHeld:
		f.Held++
	}
}

func (e *Estimated) add(x Estimated) {
	e.Tokens += x.Tokens
	e.Cost += x.Cost
	e.Resolved += x.Resolved
	e.ToHuman += x.ToHuman
	e.Attempts += x.Attempts
	e.Tasks += x.Tasks
}
