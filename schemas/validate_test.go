package schemas_test

import (
	"encoding/json"
	"fmt"
	"github.com/dispatchmesh/dispatchmesh/internal/core/whatif"
	"github.com/dispatchmesh/dispatchmesh/internal/ops/rebuild"
	opswhatif "github.com/dispatchmesh/dispatchmesh/internal/ops/whatif"
	trustpkg "github.com/dispatchmesh/dispatchmesh/trust"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dispatchmesh/dispatchmesh/events"
)

var (
	at   = time.Date(2026, 5, 18, 14, 22, 0, 123456789, time.UTC)
	task = events.Task{
		ID: "t-42", Type: "css_fix", Subject: "src/app.css",
		Payload: json.RawMessage(`{"selector": ".btn", "sizes": [1, 2]}`), MaxRetries: 5, Priority: 2,
		Metadata: map[string]string{"team": "web"}, CallbackURL: "https://hooks.example.com/done", SubmittedAt: at,
	}
	run = events.Run{
		Pass: 2, Attempt: 3, Rung: "PIVOT", Step: "implement",
		Context: "FAIL: TestButton", StepInput: "step plan passed (two-phase migration)", Note: "try the theme file",
		LastErrorClass: events.ErrorClassDeterministic, DeadEnds: []events.DeadEnd{deadEnd}, Reviewed: true, Probe: true, Readmitted: true,
	}
	deadEnd = events.DeadEnd{
		Approach: "inline the style", Reason: "the linter forbids inline styles", Attempt: 2, Rung: events.RungRefine,
	}
	base         = events.Base{Task: task, Run: run, At: at, By: "recorder@host:42", PolicyRev: 3}
	verification = events.Verification{
		Verdict: events.VerdictError, Verifier: "http", Detail: "timeout after 5s", FailOpen: true,
	}
	recorderShadow = &events.ShadowDecision{Act: "handoff", Cause: events.CauseTrust, Reason: "HANDOFF after 3 attempts", PolicyRev: 7}
	trust          = events.TrustDecision{
		Score: 0.42, Outcomes: 12, Threshold: 0.15, Exempt: true, Probe: true, Blocked: true, Reason: "probe",
		Cause: events.CauseProbe, RungTries: 9, RungSuccesses: 4, Rung: events.RungPivot,
		Shadow: &events.ShadowDecision{Act: "hold", Cause: events.CauseTrust, Reason: "score 0.42 below 0.5", PolicyRev: 7},
	}
	result = events.Result{
		Outcome: events.OutcomeFailure, Approach: "move the rule", Summary: "tests still fail",
		Changes: []string{"src/app.css"}, Error: "tests failed", ErrorClass: "model", Model: "gpt-4o", Route: "backup", Fallbacks: []string{"primary"}, Banned: []string{"9f86d081884c7d65/auth"},
		Simulated: true, RequestHash: "sha256:9f86d081884c7d65", Refused: true, TransientRetries: 2,
		ToolCalls: 9, ToolRefusals: 1, TokensIn: 1200, TokensOut: 300, Cost: 0.0123, DurationMS: 4200,
	}
	attempt = events.AttemptRecord{
		Attempt: 3, Pass: 2, Rung: "PIVOT", Step: "implement", Approach: "move the rule",
		Outcome: events.OutcomeFailure, Reason: "tests failed", ErrorClass: events.ErrorClassStep, TokensIn: 1200, TokensOut: 300, Cost: 0.0123, At: at, Model: "backup",
	}
	action = events.Action{
		TaskID: "t-42", Action: events.ActionRequeue, Note: "try the theme file", By: "alice", At: at,
	}
	toolCall = events.ToolCall{ID: "call_0", Name: "search_docs", Arguments: `{"query":"theme colours"}`}
	state    = events.TaskState{
		ID: "t-42", Type: "css_fix", Subject: "src/app.css", Status: events.StatusBlocked,
		Attempts: 7, Pass: 2, LastError: "tests failed", Reason: "attempts exhausted",
		History: []events.AttemptRecord{attempt}, TokensIn: 2400, TokensOut: 600, Cost: 0.0246,
		Rung: events.RungPivot, PivotCount: 1, DeadEnds: []events.DeadEnd{deadEnd}, RoundStart: 7,
		FailedRequests: []string{"sha256:9f86d081884c7d65"}, Refused: 1, RefusedPass: 2, TransientRetries: 4, Unbilled: events.Usage{TokensIn: 120, TokensOut: 30, Cost: 0.001},
		Resume: &events.Resume{
			Pass: 2, ToolCalls: 1, ToolRefusals: 1, ToolWaitSince: at, ToolWaits: 3,
			// one turn with every field, so each is checked against the schema
			Turns:   []events.Turn{{Role: "assistant", Content: "looking it up", ToolCalls: []events.ToolCall{toolCall}, ToolCallID: "call_0"}},
			Pending: []events.ToolCall{toolCall},
		},
		Step: "implement", StepRetries: map[string]int{"implement": 2}, Loops: map[string]int{"test>implement": 1},
		StepInputs: map[string]string{"implement": "step plan passed: two phases"}, Skips: 1, Decision: events.DecisionHandoff, Cause: events.CauseRungRate, WakeAt: at.Add(2 * time.Hour), Actions: []events.Action{action},
		SubmitSeq: 17, CallbackURL: "https://hooks.example.com/done", CreatedAt: at, UpdatedAt: at.Add(time.Hour),
	}
	stateAt    = &events.StateAt{Rev: 9, State: state}
	webhookDue = events.WebhookDue{DeliveryID: "whd_0123456789abcdef01234567", TaskID: "t-42", URL: "https://hooks.example.com/done",
		Status: events.StatusSucceeded, Body: json.RawMessage(`{"id":"t-42","status":"succeeded","terminal":true}`), SettledAt: at}
	sealed = &events.Sealed{Rev: 9, State: json.RawMessage(`{"id":"t-42","type":"css_fix"}`), MAC: "bWFj"}
)

// populated holds one fully populated value per schema; TestPopulatedValuesAreComplete
// keeps it so when a field is added.
var populated = []struct {
	name  string
	value any
}{
	{events.EventSubmit, events.Submit{
		ID: "t-42", Type: "css_fix", Subject: "src/app.css", Payload: json.RawMessage(`[1, "two", null]`),
		MaxRetries: 3, Priority: 1, Metadata: map[string]string{"ticket": "WEB-7"}, CallbackURL: "https://hooks.example.com/done",
	}},
	{events.EventQueued, events.Queued{Base: base, Sealed: sealed}},
	{events.EventIndexed, events.IndexEntry{ID: "t-42", Type: "css_fix", Subject: "src/app.css", SubmittedAt: at}},
	{events.EventWebhookDue, webhookDue},
	{events.EventWebhookTry, events.WebhookTry{DeliveryID: "whd_0123456789abcdef01234567", TaskID: "t-42", URL: "https://hooks.example.com/done", Attempt: 3, Code: 503,
		Error: "the receiver answered 503", At: at, NextAt: at.Add(20 * time.Second)}},
	{events.EventWebhookDelivered, events.WebhookDelivered{DeliveryID: "whd_0123456789abcdef01234567", TaskID: "t-42", URL: "https://hooks.example.com/done", Attempt: 2, Code: 204, At: at}},
	{events.EventWebhookFailed, events.WebhookFailed{Due: webhookDue, Attempts: 12, LastError: "the receiver answered 503", At: at}},
	{events.EventRetry, events.Retry{Base: base, Reason: "tests failed", WakeAt: at.Add(10 * time.Minute), Sealed: sealed, Shadow: recorderShadow}},
	{events.EventVerified, events.Verified{Base: base, Verification: verification, Reason: "tests failed", Sealed: sealed, Shadow: recorderShadow}},
	{events.EventCancelled, events.Cancelled{Base: base, Verification: verification}},
	{events.EventAdmitted, events.Admitted{Base: base, Trust: trust, Sealed: sealed}},
	{events.EventHeld, events.Held{Base: base, Hold: events.HoldTrust, Trust: trust, Reason: "Blocked: css_fix trust score 0.08 below 0.15", Sealed: sealed}},
	{events.EventPrompted, events.Prompted{Base: base, Prompt: events.Prompt{
		Model: "gpt-4o", Messages: []events.Message{{Role: "system", Content: "You fix CSS."}},
	}, Sealed: sealed}},
	{events.EventExecuted, events.Executed{Base: base, Result: result, State: stateAt}},
	{events.EventSucceeded, events.Succeeded{Base: base, Result: result, Shadow: recorderShadow}},
	{events.EventGated, events.Gated{Base: base, Trust: trust, Reason: "Blocked: css_fix trust score 0.08 below 0.15",
		Attempts: []events.AttemptRecord{attempt}}},
	{events.EventEscalated, events.Escalated{
		Base: base, Reason: "attempts exhausted", Cause: events.CauseRungRate, TrustScore: 0.3,
		Attempts: []events.AttemptRecord{attempt}, TokensIn: 2400, TokensOut: 600, Cost: 0.0246, Shadow: recorderShadow,
	}},
	{events.EventStuck, events.Stuck{
		Base: base, Reason: "skip budget exhausted", Skips: 3, Attempts: []events.AttemptRecord{attempt}, Shadow: recorderShadow,
	}},
	{events.EventAction, action},
	{"task_state.v1", state},
	{"model_result.v1", modelResult{
		Status: "success", Approach: "move the rule", Summary: "done", Changes: []string{"src/app.css"},
	}},
	{"api.request.v1", events.TaskRequest{ID: "t-42", Timeout: "1m30s", After: 17}},
	{"api.submit.reply.v1", events.SubmitReply{ID: "t-42", Duplicate: true}},
	{"api.wait.reply.v1", events.WaitReply{
		ID: "t-42", Type: "css_fix", Subject: "src/app.css", Status: events.StatusSucceeded, Terminal: true, TimedOut: true,
		Stage: "review.action", Step: "implement", Rung: events.RungPivot, Reason: "resolved by alice", LastError: "tests failed",
		Attempts: 3, TokensIn: 2400, TokensOut: 600, Cost: 0.0246, Result: &result, UpdatedAt: at,
	}},
	{"api.error.v1", events.ErrorReply{Error: events.NewAPIError(events.CodeRejected, "task t-42 was rejected", `"subject" is required`)}},
	{"whatif.report.v1", whatifReport(at)},
	{trustpkg.EventOutcome, trustpkg.Outcome{Key: "t-42:2:outcome", Task: "t-42", Success: true, At: at, Tokens: 1500, Cost: 0.0123, Rung: events.RungPivot, Retry: true, End: true, Probe: true, Held: true, Marker: true}},
}

func TestPopulatedValuesAreComplete(t *testing.T) {
	if len(populated) != len(messages) {
		t.Errorf("%d populated values for %d schemas", len(populated), len(messages))
	}
	for _, p := range populated {
		for _, path := range zeroFields(p.name, reflect.ValueOf(p.value)) {
			t.Errorf("%s is empty: populate it so its schema is exercised", path)
		}
	}
}

// zeroFields lists the paths of zero-valued fields, recursively.
func zeroFields(path string, v reflect.Value) []string {
	if v.IsZero() {
		return []string{path}
	}
	var zero []string
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			return nil
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				zero = append(zero, zeroFields(path+"."+v.Type().Field(i).Name, v.Field(i))...)
			}
		}
	case reflect.Slice:
		if v.Len() == 0 {
			return []string{path}
		}
		if v.Type().Elem().Kind() == reflect.Struct {
			for i := range v.Len() {
				zero = append(zero, zeroFields(fmt.Sprintf("%s[%d]", path, i), v.Index(i))...)
			}
		}
	case reflect.Map:
		if v.Len() == 0 {
			return []string{path}
		}
	}
	return zero
}

func TestPopulatedValuesValidate(t *testing.T) {
	for _, p := range populated {
		t.Run(p.name, func(t *testing.T) {
			v, err := loadSchema(p.name)
			if err != nil {
				t.Fatal(err)
			}
			doc, err := json.Marshal(p.value)
			if err != nil {
				t.Fatal(err)
			}
			for _, problem := range v.validateJSON(doc) {
				t.Errorf("%s: %s\n%s", p.name, problem, doc)
			}
		})
	}
}

// TestSchemasRejectBadEvents breaks one thing in a valid event and expects the
// schema to say where: the validator, and the schemas, are not vacuous.
func TestSchemasRejectBadEvents(t *testing.T) {
	byName := make(map[string]any)
	for _, p := range populated {
		byName[p.name] = p.value
	}
	for _, c := range []struct {
		schema  string
		breakIt func(m map[string]any)
		want    string
	}{
		{events.EventQueued, func(m map[string]any) { delete(m, "run") }, `/: "run" is required`},
		{events.EventQueued, func(m map[string]any) { obj(m, "task")["extra"] = true }, `/task: unknown property "extra"`},
		{events.EventQueued, func(m map[string]any) { obj(m, "task")["id"] = "a.b" }, `/task/id: "a.b" does not match`},
		{events.EventQueued, func(m map[string]any) { obj(m, "task")["type"] = strings.Repeat("x", 65) }, `/task/type: is longer than 64`},
		{events.EventQueued, func(m map[string]any) { m["at"] = "yesterday" }, `/at: "yesterday" is not a date-time`},
		{events.EventQueued, func(m map[string]any) { obj(m, "task")["metadata"] = map[string]any{"n": 1} }, `/task/metadata/n: is integer, want string`},
		{events.EventQueued, func(m map[string]any) { obj(m, "run")["pass"] = 1.5 }, `/run/pass: is number, want integer`},
		{events.EventVerified, func(m map[string]any) { obj(m, "verification")["verdict"] = "maybe" }, `/verification/verdict: "maybe" is not one of`},
		{events.EventExecuted, func(m map[string]any) { obj(m, "result")["tokens_in"] = "3" }, `/result/tokens_in: is string, want integer`},
		{events.EventExecuted, func(m map[string]any) { obj(m, "result")["cost"] = -1 }, `/result/cost: -1 is less than 0`},
		{events.EventPrompted, func(m map[string]any) { obj(m, "prompt")["messages"] = []any{map[string]any{"role": "user"}} }, `/prompt/messages/0: "content" is required`},
		{events.EventEscalated, func(m map[string]any) { m["attempts"] = nil }, `/attempts: is null, want array`},
		{events.EventQueued, func(m map[string]any) { obj(m, "run")["dead_ends"] = []any{map[string]any{"approach": "x"}} }, `/run/dead_ends/0: "reason" is required`},
		{events.EventQueued, func(m map[string]any) { obj(m, "run")["reviewed"] = "yes" }, `/run/reviewed: is string, want boolean`},
		{events.EventRetry, func(m map[string]any) { m["wake_at"] = "later" }, `/wake_at: "later" is not a date-time`},
		{events.EventAdmitted, func(m map[string]any) { m["policy_rev"] = "3" }, `/policy_rev: is string, want integer`},
		{events.EventExecuted, func(m map[string]any) { m["policy_rev"] = 0 }, `/policy_rev: 0 is less than 1`},
		{events.EventExecuted, func(m map[string]any) { obj(m, "result")["tool_calls"] = -1 }, `/result/tool_calls: -1 is less than 0`},
		{events.EventStuck, func(m map[string]any) { delete(m, "skips") }, `/: "skips" is required`},
		{events.EventAction, func(m map[string]any) { m["action"] = "ignore" }, `/action: "ignore" is not one of`},
		{events.EventAction, func(m map[string]any) { m["task_id"] = "a.b" }, `/task_id: "a.b" does not match`},
		{"task_state.v1", func(m map[string]any) { m["status"] = "done" }, `/status: "done" is not one of`},
		{"task_state.v1", func(m map[string]any) { m["step_retries"] = map[string]any{"implement": "2"} }, `/step_retries/implement: is string, want integer`},
		{"task_state.v1", func(m map[string]any) { m["loops"] = map[string]any{"test>implement": -1} }, `/loops/test>implement: -1 is less than 0`},
		{"task_state.v1", func(m map[string]any) { m["actions"] = []any{map[string]any{}} }, `/actions/0: "task_id" is required`},
		{"model_result.v1", func(m map[string]any) { delete(m, "approach") }, `/: "approach" is required`},
		{"model_result.v1", func(m map[string]any) { m["status"] = "partial" }, `/status: "partial" is not one of`},
		{"api.request.v1", func(m map[string]any) { m["timeout"] = "soon" }, `/timeout: "soon" does not match`},
		{"api.request.v1", func(m map[string]any) { m["timeout"] = 30 }, `/timeout: is integer, want string`},
		{"api.request.v1", func(m map[string]any) { delete(m, "id") }, `/: "id" is required`},
		{"api.wait.reply.v1", func(m map[string]any) { m["stage"] = "thinking" }, `/stage: "thinking" does not match`},
		{"api.wait.reply.v1", func(m map[string]any) { m["status"] = "done" }, `/status: "done" is not one of`},
		{"api.wait.reply.v1", func(m map[string]any) { obj(m, "result")["outcome"] = "maybe" }, `/result/outcome: "maybe" is not one of`},
		{"api.error.v1", func(m map[string]any) { obj(m, "error")["problems"] = nil }, `/error/problems: is null, want array`},
		{"api.error.v1", func(m map[string]any) { obj(m, "error")["code"] = 418 }, `/error/code: 418 is not one of`},
		{"api.error.v1", func(m map[string]any) { m["id"] = "t-42" }, `/: unknown property "id"`},
	} {
		v, err := loadSchema(c.schema)
		if err != nil {
			t.Fatal(err)
		}
		doc, _ := json.Marshal(byName[c.schema])
		var m map[string]any
		if err := json.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		c.breakIt(m)
		doc, _ = json.Marshal(m)
		problems := v.validateJSON(doc)
		if !containsProblem(problems, c.want) {
			t.Errorf("%s: want a problem %q, got %q\n%s", c.schema, c.want, problems, doc)
		}
	}
}

func obj(m map[string]any, key string) map[string]any { return m[key].(map[string]any) }

func containsProblem(problems []string, want string) bool {
	for _, p := range problems {
		if strings.Contains(p, want) {
			return true
		}
	}
	return false
}

// TestSubmitSchemaMirrorsDecodeSubmit feeds the same documents to the schema
// and to events.DecodeSubmit (as if sent to the API, no subject type): a
// client that validates against the schema gets the answer intake would give.
func TestSubmitSchemaMirrorsDecodeSubmit(t *testing.T) {
	v, err := loadSchema(events.EventSubmit)
	if err != nil {
		t.Fatal(err)
	}
	metadata := func(n int) string {
		pairs := make([]string, n)
		for i := range pairs {
			pairs[i] = fmt.Sprintf(`"k%d":"v"`, i)
		}
		return "{" + strings.Join(pairs, ",") + "}"
	}
	for _, c := range []struct {
		name  string
		doc   string
		valid bool
	}{
		{"minimal", `{"type":"css_fix","subject":"src/app.css"}`, true},
		{"full", `{"id":"t-42","type":"css_fix","subject":"src/app.css","payload":{"a":[1,2]},"max_retries":3,"priority":-1,"metadata":{"team":"web"}}`, true},
		{"payload string", `{"type":"a","subject":"s","payload":"x"}`, true},
		{"payload null", `{"type":"a","subject":"s","payload":null}`, true},
		{"payload number", `{"type":"a","subject":"s","payload":1.5e3}`, true},
		{"limits", `{"id":"` + strings.Repeat("I", events.MaxIDLen) + `","type":"` + strings.Repeat("t", events.MaxTypeLen) +
			`","subject":"` + strings.Repeat("s", events.MaxSubjectLen) + `","metadata":` + metadata(events.MaxMetadataPairs) + `}`, true},
		{"max_retries zero", `{"type":"a","subject":"s","max_retries":0}`, true},

		{"missing type", `{"subject":"src/app.css"}`, false},
		{"empty type", `{"type":"","subject":"s"}`, false},
		{"type not a string", `{"type":7,"subject":"s"}`, false},
		{"type upper case", `{"type":"CSS_fix","subject":"s"}`, false},
		{"type with dot", `{"type":"css.fix","subject":"s"}`, false},
		{"type too long", `{"type":"` + strings.Repeat("t", events.MaxTypeLen+1) + `","subject":"s"}`, false},
		{"missing subject", `{"type":"a"}`, false},
		{"empty subject", `{"type":"a","subject":""}`, false},
		{"subject too long", `{"type":"a","subject":"` + strings.Repeat("s", events.MaxSubjectLen+1) + `"}`, false},
		{"id with dot", `{"id":"a.b","type":"a","subject":"s"}`, false},
		{"id with wildcard", `{"id":"*","type":"a","subject":"s"}`, false},
		{"id too long", `{"id":"` + strings.Repeat("i", events.MaxIDLen+1) + `","type":"a","subject":"s"}`, false},
		{"max_retries string", `{"type":"a","subject":"s","max_retries":"3"}`, false},
		{"max_retries negative", `{"type":"a","subject":"s","max_retries":-1}`, false},
		{"priority fraction", `{"type":"a","subject":"s","priority":1.5}`, false},
		{"unknown field", `{"type":"a","subject":"s","colour":"red"}`, false},
		{"metadata value not a string", `{"type":"a","subject":"s","metadata":{"n":1}}`, false},
		{"metadata too big", `{"type":"a","subject":"s","metadata":` + metadata(events.MaxMetadataPairs+1) + `}`, false},
		{"not an object", `["css_fix"]`, false},
		{"string", `"css_fix"`, false},
	} {
		_, decodeErr := events.DecodeSubmit([]byte(c.doc), "")
		problems := v.validateJSON([]byte(c.doc))
		if (decodeErr == nil) != c.valid {
			t.Errorf("%s: DecodeSubmit error = %v, want valid=%v", c.name, decodeErr, c.valid)
		}
		if (len(problems) == 0) != c.valid {
			t.Errorf("%s: schema problems = %q, want valid=%v", c.name, problems, c.valid)
		}
	}
}

// TestSubmitSchemaKnownDifferences pins where the schema and DecodeSubmit
// deliberately disagree, so a change on either side is noticed.
func TestSubmitSchemaKnownDifferences(t *testing.T) {
	v, err := loadSchema(events.EventSubmit)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, doc, subjectType string
		decodes, validates     bool
	}{
		// Intake takes a missing type from dispatch.submit.<type>; the schema
		// asks clients to always send it.
		{"type from subject", `{"subject":"s"}`, "css_fix", true, false},
		// An empty id means "generate one" to intake; the schema says omit it.
		{"empty id", `{"id":"","type":"a","subject":"s"}`, "", true, false},
		// encoding/json matches field names case-insensitively.
		{"field name case", `{"Type":"a","SUBJECT":"s"}`, "", true, false},
		// maxLength counts characters, intake counts bytes.
		{"multibyte subject", `{"type":"a","subject":"` + strings.Repeat("é", events.MaxSubjectLen) + `"}`, "", false, true},
		// JSON Schema's integer is a mathematical integer; Go wants an integer literal.
		{"integral float", `{"type":"a","subject":"s","max_retries":3.0}`, "", false, true},
	} {
		_, decodeErr := events.DecodeSubmit([]byte(c.doc), c.subjectType)
		problems := v.validateJSON([]byte(c.doc))
		if (decodeErr == nil) != c.decodes {
			t.Errorf("%s: DecodeSubmit error = %v, want decodes=%v", c.name, decodeErr, c.decodes)
		}
		if (len(problems) == 0) != c.validates {
			t.Errorf("%s: schema problems = %q, want validates=%v", c.name, problems, c.validates)
		}
	}
}

// whatifReport is a what-if report with every field set.
func whatifReport(at time.Time) opswhatif.Result {
	f := whatif.Figures{Tokens: 1200, Cost: 0.01, Resolved: 3, ToHuman: 1, Held: 1, Attempts: 6}
	w := whatif.WhatIf{Figures: f, Estimated: whatif.Estimated{Tokens: 300.5, Cost: 0.002, Resolved: 0.6, ToHuman: 0.4, Attempts: 2.5, Tasks: 1}}
	fate := whatif.Fate{Fate: whatif.FateEstimated, Decision: "estimate", Cause: "trusted", Reason: "from attempt 3", Attempts: 2, Tokens: 400, Cost: 0.004, Resolve: 0.6}
	return opswhatif.Result{
		Report: whatif.Report{Since: at, PolicyRevision: 4, Tasks: 5, Actual: f, WhatIf: w,
			ByType:  map[string]whatif.TypeReport{"css_fix": {Tasks: 5, Actual: f, WhatIf: w}},
			Changed: []whatif.Change{{ID: "t-42", Type: "css_fix", Actual: fate, WhatIf: fate, Cause: "gate: admit (trusted)"}}},
		Skipped: []rebuild.Skipped{{Subject: "dispatch.task.t-1.executed", Seq: 9, Error: "bad json"}},
	}
}
