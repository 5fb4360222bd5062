#!/usr/bin/env python3
"""A receiver of dispatchmesh's completion webhooks, standard library only.

It checks each POST's Dispatch-Signature (HMAC-SHA256 over "<t>.<body>"
under the shared secret, and a timestamp within 5 minutes), answers 204, and
handles each delivery id once: the mesh delivers at least once, so the same
id may come again.

    WEBHOOK_SECRET=... LISTEN=127.0.0.1:8099 python3 examples/python/webhook_receiver.py

See docs/api.md#webhooks.
"""
import hashlib
import hmac
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE = 300  # seconds


def verify(secret: bytes, header: str, delivery: str, body: bytes, now: float) -> str:
    """Returns "" when header signs the delivery id and body, else what is wrong."""
    ts, sigs = None, []
    for part in header.split(","):
        k, _, v = part.strip().partition("=")
        if k == "t":
            ts = v
        elif k == "v1":
            sigs.append(v)
    if ts is None or not ts.isdigit() or not sigs:
        return "malformed signature header"
    if abs(now - int(ts)) > TOLERANCE:
        return "timestamp outside the tolerance"
    want = hmac.new(secret, ts.encode() + b"." + delivery.encode() + b"." + body, hashlib.sha256).hexdigest()
    if any(hmac.compare_digest(s, want) for s in sigs):
        return ""
    return "no signature matches"


SECRET = os.environ.get("WEBHOOK_SECRET", "").encode()
MAX_BODY = 4 << 20  # a wait answer is at most about 1 MiB
seen, lock = set(), threading.Lock()  # a real receiver keeps this in its database


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        try:
            length = int(self.headers.get("Content-Length", 0))
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:  # read nothing unbounded before the signature is checked
            self.send_error(413, "body too large or no length")
            return
        body = self.rfile.read(length)
        delivery = self.headers.get("Dispatch-Delivery", "")
        problem = verify(SECRET, self.headers.get("Dispatch-Signature", ""), delivery, body, time.time())
        if problem:
            self.send_error(401, problem)
            return
        try:
            answer = json.loads(body)
        except ValueError:
            self.send_error(400, "not JSON")
            return
        with lock:
            first = delivery not in seen
            seen.add(delivery)
        if first:  # handle it once; a repeat is acknowledged, not redone
            print(f"delivery {delivery}: task {answer.get('id')} {answer.get('status')}", flush=True)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    if not SECRET or "LISTEN" not in os.environ:
        sys.exit("set WEBHOOK_SECRET and LISTEN")
    host, _, port = os.environ["LISTEN"].rpartition(":")
    ThreadingHTTPServer((host, int(port)), Handler).serve_forever()
