package executor_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dispatchmesh/dispatchmesh/events"
	"github.com/dispatchmesh/dispatchmesh/services/executor"
)

func TestParseResult(t *testing.T) {
	ok := executor.ModelResult{Status: "success", Approach: "a", Summary: "s", Changes: []string{"c"}}
	tests := []struct {
		name    string
		content string
		want    executor.ModelResult
		wantErr string // substring of the error; "" means success
	}{
		{"plain", `{"status":"success","approach":"a","summary":"s","changes":["c"]}`, ok, ""},
		{"fenced", "```json\n{\"status\":\"success\",\"approach\":\"a\",\"summary\":\"s\",\"changes\":[\"c\"]}\n```", ok, ""},
		{"prose around", "Sure! {\"status\":\"success\",\"approach\":\"a\",\"summary\":\"s\",\"changes\":[\"c\"]} Hope it helps.", ok, ""},
		{"nested braces", `{"status":"failure","approach":"use {x}","summary":"map {a:{b}}"}`,
			executor.ModelResult{Status: "failure", Approach: "use {x}", Summary: "map {a:{b}}"}, ""},
		{"status case and space", `{"status":" Failure ","approach":" a "}`, executor.ModelResult{Status: "failure", Approach: "a"}, ""},
		{"unknown fields ignored", `{"status":"success","approach":"a","confidence":0.9}`, executor.ModelResult{Status: "success", Approach: "a"}, ""},
		{"empty", "  \n", executor.ModelResult{}, "the answer is empty"},
		{"prose only", "I fixed it.", executor.ModelResult{}, "no JSON object"},
		{"reversed braces", "} oops {", executor.ModelResult{}, "no JSON object"},
		{"truncated", `{"status":"success","approach":"a"`, executor.ModelResult{}, "no JSON object"},
		{"malformed", `{"status":"success",}`, executor.ModelResult{}, "malformed JSON"},
		{"wrong type", `{"status":"success","approach":"a","changes":"one"}`, executor.ModelResult{}, `field "changes" must be []string`},
		{"two objects", `{"status":"success","approach":"a"} and {"x":1}`, executor.ModelResult{}, "malformed JSON"},
		{"missing status", `{"approach":"a"}`, executor.ModelResult{}, `"status" is missing`},
		{"bad status", `{"status":"done","approach":"a"}`, executor.ModelResult{}, `"status" "done" is not "success" or "failure"`},
		{"missing approach", `{"status":"success","approach":"  "}`, executor.ModelResult{}, `"approach" is missing`},
		{"both missing", `{}`, executor.ModelResult{}, `"status" is missing (want "success" or "failure"); "approach" is missing`},
		{"capped", fmt.Sprintf(`{"status":"success","approach":%q,"summary":%q,"changes":[%q]}`,
			strings.Repeat("a", 3000), strings.Repeat("s", 9000), strings.Repeat("c", 600)),
			executor.ModelResult{Status: "success",
				Approach: strings.Repeat("a", 2021) + "… [cut: 979 bytes more]",
				Summary:  strings.Repeat("s", 8165) + "… [cut: 835 bytes more]",
				Changes:  []string{strings.Repeat("c", 487) + "… [cut: 113 bytes more]"}}, ""},
		{"too many changes", `{"status":"failure","approach":"a","changes":[` + strings.Repeat(`"c",`, 40) + `"last"]}`,
			executor.ModelResult{Status: "failure", Approach: "a",
				Changes: append(slices.Repeat([]string{"c"}, 31), "… [cut: 10 more entries, 13 bytes]")}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := executor.ParseResult(tt.content)
			if tt.wantErr == "" {
				if err != nil || !reflect.DeepEqual(got, tt.want) {
					t.Errorf("ParseResult = %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ParseResult error %v, want one containing %q", err, tt.wantErr)
			}
			if !errors.Is(err, executor.ErrInvalidOutput) {
				t.Errorf("error %v is not ErrInvalidOutput", err)
			}
			var ioe *executor.InvalidOutputError
			if !errors.As(err, &ioe) || ioe.Answer != tt.content {
				t.Errorf("error %#v should carry the whole answer", err)
			}
		})
	}
}

func TestParseResultQuotesAnExcerpt(t *testing.T) {
	long := strings.Repeat("é", 1000)
	_, err := executor.ParseResult(long)
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	if n := strings.Count(msg, "é"); n != 200 {
		t.Errorf("error quotes %d characters of the answer, want 200", n)
	}
	if !strings.Contains(msg, "…") || !utf8.ValidString(msg) {
		t.Errorf("error %q should mark the cut and stay valid UTF-8", msg)
	}
}

func FuzzParseResult(f *testing.F) {
	for _, s := range []string{
		`{"status":"success","approach":"a","summary":"s","changes":["c"]}`,
		"```json\n{\"status\":\"failure\",\"approach\":\"b\"}\n```",
		"prose {\"status\":\"SUCCESS\",\"approach\":\"x\"} prose",
		`{"status":1}`, "}{", "", "{", `{"changes":[null]}`, "\xff{\"status\":\"success\",\"approach\":\"\xfe\"}",
	} {
		f.Add(s)
	}
	f.Add(`{"status":"success","approach":"` + strings.Repeat("é", 1500) + `","summary":"` + strings.Repeat("s", 9000) +
		`","changes":[` + strings.Repeat(`"c",`, 40) + `"` + strings.Repeat("\\u00e9", 400) + `"]}`)
	f.Fuzz(func(t *testing.T, content string) {
		r, err := executor.ParseResult(content)
		if err != nil {
			if !errors.Is(err, executor.ErrInvalidOutput) {
				t.Fatalf("error %v is not ErrInvalidOutput", err)
			}
			_ = err.Error()
			return
		}
		if r.Status != events.OutcomeSuccess && r.Status != events.OutcomeFailure {
			t.Fatalf("status %q accepted", r.Status)
		}
		if strings.TrimSpace(r.Approach) == "" {
			t.Fatalf("empty approach accepted")
		}
		// Decoded text is valid UTF-8 and capped, whatever the answer.
		if len(r.Approach) > events.MaxApproach || len(r.Summary) > events.MaxSummary || len(r.Changes) > events.MaxChanges {
			t.Fatalf("answer not capped: approach %d bytes, summary %d, %d changes", len(r.Approach), len(r.Summary), len(r.Changes))
		}
		for _, s := range append([]string{r.Approach, r.Summary}, r.Changes...) {
			if !utf8.ValidString(s) {
				t.Fatalf("decoded text %q is not valid UTF-8", s)
			}
		}
		for _, c := range r.Changes {
			if len(c) > events.MaxChange {
				t.Fatalf("a change of %d bytes kept", len(c))
			}
		}
	})
}
