#!/bin/sh
# Submit a task to dispatchmesh with the stock `nats` CLI, wait for its
# outcome, print it.
#   ./submit.sh ['{"type":"css_fix","subject":"src/app.css"}']
# NATS_URL says where `dispatch up` listens (default nats://127.0.0.1:4222).
# As a user of deploy/ (the `client` user): NATS_USER and NATS_PASSWORD (the
# CLI reads both), and NATS_INBOX_PREFIX=_INBOX.client, the only inbox it may
# read (passed as --inbox-prefix).
task=${1:-'{"type":"css_fix","subject":"src/app.css","payload":{"issue":"button misaligned"}}'}

# ask SUBJECT BODY TIMEOUT sets $answer. `nats req` exits 0 even when nothing
# answered (timeout, no responders, a permission denied): that fails here.
ask() {
  answer=$(nats req --raw --timeout "$3" ${NATS_INBOX_PREFIX:+--inbox-prefix "$NATS_INBOX_PREFIX"} "$1" "$2") || return 1
  [ -n "$answer" ] || { echo "$1: no answer" >&2; return 1; }
}

# Every answer is JSON; a failed one is {"error":{"code":…,"message":…,"problems":[…]}}.
ask dispatch.api.submit "$task" 5s || exit 1
case $answer in *'"error":'*) printf '%s\n' "$answer" >&2; exit 1 ;; esac
id=$(printf '%s' "$answer" | sed 's/.*"id":"\([^"]*\)".*/\1/')
echo "submitted $id, waiting"

# Answered once the task is terminal (or after "timeout", with where it is).
ask dispatch.api.wait "{\"id\":\"$id\",\"timeout\":\"60s\"}" 65s || exit 1
printf '%s\n' "$answer"
case $answer in *'"status":"succeeded"'*) exit 0 ;; *) exit 1 ;; esac
