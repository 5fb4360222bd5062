package events_test

import (
	"strings"
	"testing"

	"github.com/dispatchmesh/dispatchmesh/events"
)

var stages = []string{
	events.StageQueued, events.StageRetry, events.StageVerified, events.StageAdmitted,
	events.StagePrompted, events.StageExecuted, events.StageSucceeded, events.StageCancelled,
}

var reviewReasons = []string{
	events.ReviewRejected, events.ReviewGated, events.ReviewEscalated, events.ReviewPoison, events.ReviewStuck,
}

func TestSubjectBuilders(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{events.SubmitSubject("css_fix"), "dispatch.submit.css_fix"},
		{events.TaskSubject("t-42", events.StageQueued), "dispatch.task.t-42.queued"},
		{events.StageFilter(events.StageVerified), "dispatch.task.*.verified"},
		{events.TaskFilter("t-42"), "dispatch.task.t-42.>"},
		{events.ReviewSubject(events.ReviewGated, "t-42"), "dispatch.review.gated.t-42"},
		{events.ReviewTaskFilter("t-42"), "dispatch.review.*.t-42"},
		{events.SubmitFilter, "dispatch.submit.>"},
		{events.ReviewFilter, "dispatch.review.>"},
		{events.AllSubjects, "dispatch.>"},
		{events.SubmitAPI, "dispatch.api.submit"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

// TestFiltersMatch checks the filters against the subjects they are meant to
// select, with NATS matching rules, and that they select nothing else.
func TestFiltersMatch(t *testing.T) {
	ids := []string{"t-42", "T_43", "queued"}
	for _, id := range ids {
		for _, stage := range stages {
			subj := events.TaskSubject(id, stage)
			if !subjectMatches(events.AllSubjects, subj) {
				t.Errorf("%s does not match %s", events.AllSubjects, subj)
			}
			for _, other := range stages {
				if got := subjectMatches(events.StageFilter(other), subj); got != (other == stage) {
					t.Errorf("StageFilter(%q) matches %s: %v", other, subj, got)
				}
			}
			for _, other := range ids {
				if got := subjectMatches(events.TaskFilter(other), subj); got != (other == id) {
					t.Errorf("TaskFilter(%q) matches %s: %v", other, subj, got)
				}
				if subjectMatches(events.ReviewTaskFilter(other), subj) || subjectMatches(events.ReviewFilter, subj) {
					t.Errorf("a review filter matches task subject %s", subj)
				}
			}
		}
		for _, reason := range reviewReasons {
			subj := events.ReviewSubject(reason, id)
			if !subjectMatches(events.ReviewFilter, subj) || !subjectMatches(events.ReviewTaskFilter(id), subj) {
				t.Errorf("review filters do not match %s", subj)
			}
			if subjectMatches(events.TaskFilter(id), subj) || subjectMatches(events.ReviewTaskFilter("other"), subj) {
				t.Errorf("a filter of another kind or task matches %s", subj)
			}
		}
	}
	submit := events.SubmitSubject("css_fix")
	if !subjectMatches(events.SubmitFilter, submit) || subjectMatches(events.SubmitFilter, events.SubmitAPI) {
		t.Errorf("SubmitFilter must match %s and not %s", submit, events.SubmitAPI)
	}
	// Every submission, bare dispatch.submit too, is matched by exactly one
	// of SubmitFilters (a consumer's filters must not overlap); the API is not.
	for _, subj := range []string{submit, events.SubmitRoot, "dispatch.submit.a.b", "dispatch.submit.*"} {
		n := 0
		for _, f := range events.SubmitFilters {
			if subjectMatches(f, subj) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d of SubmitFilters %v match %s, want 1", n, events.SubmitFilters, subj)
		}
	}
	for _, f := range events.SubmitFilters {
		if subjectMatches(f, events.SubmitAPI) {
			t.Errorf("%s matches %s", f, events.SubmitAPI)
		}
	}
}

// subjectMatches applies NATS wildcard rules: * is one token, > the rest.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(f) == len(s)
}

func TestParseTaskSubject(t *testing.T) {
	for _, stage := range stages {
		id, got, ok := events.ParseTaskSubject(events.TaskSubject("t-42", stage))
		if !ok || id != "t-42" || got != stage {
			t.Errorf("ParseTaskSubject(TaskSubject(t-42, %s)) = %q, %q, %v", stage, id, got, ok)
		}
	}
	for _, bad := range []string{
		"",
		"dispatch",
		"dispatch.task",
		"dispatch.task.",
		"dispatch.task.t-42",
		"dispatch.task.t-42.",
		"dispatch.task..queued",
		"dispatch.task.t-42.queued.extra",
		"dispatch.taskx.t-42.queued",
		"dispatch.review.gated.t-42",
		"dispatch.submit.css_fix",
		"other.task.t-42.queued",
	} {
		if id, stage, ok := events.ParseTaskSubject(bad); ok || id != "" || stage != "" {
			t.Errorf("ParseTaskSubject(%q) = %q, %q, %v; want not ok", bad, id, stage, ok)
		}
	}
}

func TestParseReviewSubject(t *testing.T) {
	for _, reason := range reviewReasons {
		got, key, ok := events.ParseReviewSubject(events.ReviewSubject(reason, "t-42"))
		if !ok || got != reason || key != "t-42" {
			t.Errorf("ParseReviewSubject(ReviewSubject(%s, t-42)) = %q, %q, %v", reason, got, key, ok)
		}
	}
	for _, bad := range []string{
		"",
		"dispatch.review",
		"dispatch.review.",
		"dispatch.review.gated",
		"dispatch.review.gated.",
		"dispatch.review..t-42",
		"dispatch.review.gated.t-42.extra",
		"dispatch.reviewx.gated.t-42",
		"dispatch.task.t-42.queued",
	} {
		if reason, key, ok := events.ParseReviewSubject(bad); ok || reason != "" || key != "" {
			t.Errorf("ParseReviewSubject(%q) = %q, %q, %v; want not ok", bad, reason, key, ok)
		}
	}
}

// token reports whether s can be one subject token.
func token(s string) bool { return s != "" && !strings.Contains(s, ".") }

func FuzzParseTaskSubject(f *testing.F) {
	f.Add("t-42", "queued")
	f.Add("a.b", "queued")
	f.Add("t", "a.b")
	f.Add("", "")
	f.Add("dispatch.task.t.queued", "x")
	f.Fuzz(func(t *testing.T, id, stage string) {
		subj := events.TaskSubject(id, stage)
		gotID, gotStage, ok := events.ParseTaskSubject(subj)
		if token(id) && token(stage) && (!ok || gotID != id || gotStage != stage) {
			t.Fatalf("ParseTaskSubject(%q) = %q, %q, %v; want %q, %q", subj, gotID, gotStage, ok, id, stage)
		}
		// Whatever parses is rebuilt exactly, for any input.
		for _, s := range []string{subj, id} {
			if gotID, gotStage, ok := events.ParseTaskSubject(s); ok {
				if rebuilt := events.TaskSubject(gotID, gotStage); rebuilt != s {
					t.Fatalf("ParseTaskSubject(%q) = %q, %q: rebuilt as %q", s, gotID, gotStage, rebuilt)
				}
			}
			if reason, key, ok := events.ParseReviewSubject(s); ok {
				if rebuilt := events.ReviewSubject(reason, key); rebuilt != s {
					t.Fatalf("ParseReviewSubject(%q) = %q, %q: rebuilt as %q", s, reason, key, rebuilt)
				}
			}
		}
		reason, key, ok := events.ParseReviewSubject(events.ReviewSubject(id, stage))
		if token(id) && token(stage) && (!ok || reason != id || key != stage) {
			t.Fatalf("ParseReviewSubject(ReviewSubject(%q, %q)) = %q, %q, %v", id, stage, reason, key, ok)
		}
	})
}
