#!/bin/sh
# Submit a task to dispatchmesh over HTTP with curl, wait for its outcome,
# print it.
#   ./submit.sh ['{"type":"css_fix","subject":"src/app.css"}']
# DISPATCH_API_URL is the client API (default
# http://127.0.0.1:8080/api/v1/tasks, `dispatch up`'s "api:" line);
# DISPATCH_API_TOKEN its client token (not the reviewers').
api=${DISPATCH_API_URL:-http://127.0.0.1:8080/api/v1/tasks}
task=${1:-'{"type":"css_fix","subject":"src/app.css","payload":{"issue":"button misaligned"}}'}

# ask ARGS… sets $answer and $code (the HTTP status); every answer is JSON,
# a failed one {"error":{"code":…,"message":…,"problems":[…]}}.
ask() {
  out=$(curl -sS -w '\n%{http_code}' -H "Authorization: Bearer $DISPATCH_API_TOKEN" "$@") || return 1
  code=${out##*
}
  answer=${out%
*}
}

ask -d "$task" "$api" || exit 1
case $code in 200|201) ;; *) printf '%s %s\n' "$code" "$answer" >&2; exit 1 ;; esac
id=$(printf '%s' "$answer" | sed 's/.*"id":"\([^"]*\)".*/\1/')
echo "submitted $id, waiting"

ask "$api/$id?wait=60s" || exit 1
printf '%s %s\n' "$code" "$answer"
case $answer in *'"status":"succeeded"'*) exit 0 ;; *) exit 1 ;; esac
