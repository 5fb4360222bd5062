// Package examples holds copyable programs that submit a task to a running
// `dispatch up`, wait for its outcome and print it — with the stock `nats`
// CLI (cli/), Node.js (js/, npm package "nats"; also a verifier and a tool
// written as NATS micro services), C (c/, Debian's libnats-dev), the Go
// client (go/), and over the client HTTP API with curl (curl/) and Python's
// standard library (python/) — and the interop test that runs every one of
// them against a real `dispatch up`, then the submitting ones, as the
// untrusted client user, against the deployment of deploy/ (NATS_USER,
// NATS_PASSWORD, NATS_INBOX_PREFIX; the HTTP ones through `dispatch web`
// run as the web user, DISPATCH_API_URL and DISPATCH_API_TOKEN), and sees
// the 409 of an id submitted again with another body.
package examples
