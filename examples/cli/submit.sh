#!/bin/sh
# Submit a task to dispatchmesh with the stock `nats` CLI, wait for its
# outcome, print it.
#   ./submit.sh ['{"type":"css_fix","subject":"src/app.css"}']
# NATS_URL says where `dispatch up` listens (default nats://127.0.0.1:4222).
task=${1:-'{"type":"css_fix","subject":"src/app.css","payload":{"issue":"button misaligned"}}'}

# Every answer is JSON; a failed one is {"error":{"code":…,"message":…,"problems":[…]}}.
answer=$(nats req --raw --timeout 5s dispatch.api.submit "$task") || exit 1
case $answer in *'"error":'*) printf '%s\n' "$answer" >&2; exit 1 ;; esac
id=$(printf '%s' "$answer" | sed 's/.*"id":"\([^"]*\)".*/\1/')
echo "submitted $id, waiting"

# Answered once the task is terminal (or after "timeout", with where it is).
answer=$(nats req --raw --timeout 65s dispatch.api.wait "{\"id\":\"$id\",\"timeout\":\"60s\"}") || exit 1
printf '%s\n' "$answer"
case $answer in *'"status":"succeeded"'*) exit 0 ;; *) exit 1 ;; esac
