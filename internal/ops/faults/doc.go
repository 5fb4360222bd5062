// Package faults is the fault suite of the mesh (issue 9): the real
// binaries — nats-server loaded from deploy/nats and two `dispatch
// <service>` processes per service, each as its own NATS user — run a
// steady load of tasks against a scripted OpenAI-compatible model while the
// suite SIGKILLs random instances (and instances aimed at: an executor
// mid-call, an executor between the model's answer and its publish, the
// recorders right after one of them wrote a subject's history, before it
// published and acked), restarts nats-server, and SIGTERMs everything; a
// second run does the same on a 3-node JetStream cluster with R3 stream
// and buckets and shuts the stream leader down.
//
// When the mesh is idle again, Check holds the stores to what a mesh that
// loses nothing and does nothing twice must show: one terminal record per
// task, the attempts the model's answers imply, the last outcomes and
// failures of every (type, subject) in its history record (the newest
// attempts, each once), each type's trust outcomes and daily spend equal
// to the recorded outcomes, every model call accounted for, and `dispatch
// rebuild` agreeing with the live stores. The tests are in this package's
// _test files; Check and Plan are the part that does not need a test
// binary.
//
//	go test ./internal/ops/faults                                  # default: ≥ 20 kills
//	go test ./internal/ops/faults -run Fault -faults.long -timeout 30m   # long: 100 kills
package faults
