#!/usr/bin/env python3
"""Submit a task to dispatchmesh over HTTP, wait for its outcome, print it.

Python's standard library only (urllib): no NATS client needed.

    python3 submit.py ['{"type":"css_fix","subject":"src/app.css"}']

DISPATCH_API_URL is the client API (default http://127.0.0.1:8080/api/v1/tasks,
as `dispatch up` prints on its "api:" line); DISPATCH_API_TOKEN its client
token (the one `dispatch up` printed, or DISPATCH_HTTP_CLIENT_TOKEN) — not the
reviewers' token. Exits 0 when the task succeeded, 1 otherwise: an invalid
task prints the validation error (every problem) and exits 1.
"""
import json
import os
import sys
import urllib.error
import urllib.request

API = os.environ.get("DISPATCH_API_URL", "http://127.0.0.1:8080/api/v1/tasks").rstrip("/")
TOKEN = os.environ.get("DISPATCH_API_TOKEN", "")


class APIError(Exception):
    """A failed answer: {"error": {"code", "message", "problems"}}."""

    def __init__(self, code, message, problems):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.problems = code, message, problems


def call(method, url, body=None, timeout=10):
    """Send a request; return the JSON answer, or raise APIError."""
    data = None if body is None else body.encode()
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            err = json.loads(raw)["error"]
        except (ValueError, KeyError, TypeError):
            raise APIError(e.code, raw.decode(errors="replace").strip() or e.reason, [])
        raise APIError(err["code"], err["message"], err.get("problems") or [])


def main():
    task = sys.argv[1] if len(sys.argv) > 1 else json.dumps(
        {"type": "css_fix", "subject": "src/app.css", "payload": {"issue": "button misaligned"}})
    try:
        # 201 {"id"}: queued; 200 {"id", "duplicate": true}: the same task again.
        task_id = call("POST", API, task)["id"]
        print(f"submitted {task_id}, waiting", flush=True)
        # Answered once the task settles, or after 60s with "timed_out": true.
        while True:
            out = call("GET", f"{API}/{task_id}?wait=60s", timeout=75)
            if not out.get("timed_out"):
                break
            print(f"still {out['status']} at stage {out.get('stage', '?')}", flush=True)
    except APIError as e:
        # 400: invalid task (problems lists each); 409: this id has another
        # body; 401: the token; 503: busy or stopping, ask again.
        print(f"error {e.code}: {e.message}", file=sys.stderr)
        for p in e.problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    except urllib.error.URLError as e:
        print(f"cannot reach {API}: {e.reason} (is `dispatch up` running? DISPATCH_API_URL)", file=sys.stderr)
        return 1
    print(out["status"], f"attempts={out['attempts']}", f"cost={out['cost']}")
    result = out.get("result") or {}
    if result.get("summary"):
        print("summary:", result["summary"])
    return 0 if out["status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
