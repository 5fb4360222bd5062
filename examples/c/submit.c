// Submit a task to dispatchmesh from C (nats.c: Debian's libnats-dev), wait
// for its outcome, print it.
//   cc -o submit submit.c -lnats && ./submit ['{"type":"css_fix","subject":"src/app.css"}']
// NATS_URL says where `dispatch up` listens (default nats://127.0.0.1:4222).
// As a user of deploy/ (the `client` user): NATS_USER, NATS_PASSWORD, and
// NATS_INBOX_PREFIX=_INBOX.client, the only inbox it may read.
#include <nats/nats.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ask sends body to subject and returns the JSON answer (free it), or NULL
// when there is none or it is an error — {"error": {"code", "message",
// "problems"}}, whose code and message are also in the micro headers.
static char *ask(natsConnection *nc, const char *subject, const char *body, int64_t timeout_ms)
{
    natsMsg *reply = NULL;
    const char *code = NULL, *message = NULL;
    natsStatus s = natsConnection_RequestString(&reply, nc, subject, body, timeout_ms);
    if (s != NATS_OK) {
        fprintf(stderr, "%s: %s\n", subject, natsStatus_GetText(s));
        return NULL;
    }
    char *answer = strndup(natsMsg_GetData(reply), natsMsg_GetDataLength(reply));
    if (natsMsgHeader_Get(reply, "Nats-Service-Error-Code", &code) == NATS_OK) {
        natsMsgHeader_Get(reply, "Nats-Service-Error", &message);
        fprintf(stderr, "error %s: %s\n%s\n", code, message ? message : "", answer);
        free(answer);
        answer = NULL;
    }
    natsMsg_Destroy(reply);
    return answer;
}

int main(int argc, char **argv)
{
    const char *task = argc > 1 ? argv[1]
        : "{\"type\":\"css_fix\",\"subject\":\"src/app.css\",\"payload\":{\"issue\":\"button misaligned\"}}";
    const char *url = getenv("NATS_URL") ? getenv("NATS_URL") : "nats://127.0.0.1:4222";
    natsOptions *opts = NULL;
    natsConnection *nc = NULL;
    char id[129], wait[256];
    int rc = 1;

    // Unset, getenv gives NULL: no user, the default inbox prefix _INBOX.
    natsStatus s = natsOptions_Create(&opts);
    if (s == NATS_OK) s = natsOptions_SetURL(opts, url);
    if (s == NATS_OK) s = natsOptions_SetUserInfo(opts, getenv("NATS_USER"), getenv("NATS_PASSWORD"));
    if (s == NATS_OK) s = natsOptions_SetCustomInboxPrefix(opts, getenv("NATS_INBOX_PREFIX"));
    if (s == NATS_OK) s = natsConnection_Connect(&nc, opts);
    natsOptions_Destroy(opts);
    if (s != NATS_OK) {
        fprintf(stderr, "cannot connect to %s: %s\n", url, natsStatus_GetText(s));
        return 1;
    }
    char *answer = ask(nc, "dispatch.api.submit", task, 5000);   // {"id":"…"}
    if (answer != NULL && sscanf(answer, "{\"id\":\"%128[^\"]\"", id) == 1) {
        printf("submitted %s, waiting\n", id);
        free(answer);
        // Answered once the task is terminal (or after "timeout", with where it is).
        snprintf(wait, sizeof wait, "{\"id\":\"%s\",\"timeout\":\"60s\"}", id);
        answer = ask(nc, "dispatch.api.wait", wait, 65000);
        if (answer != NULL) {
            printf("%s\n", answer);   // status, result.summary, attempts, cost: schema api.wait.reply.v1
            rc = strstr(answer, "\"status\":\"succeeded\"") != NULL ? 0 : 1;
        }
    }
    free(answer);
    natsConnection_Destroy(nc);
    nats_Close();
    return rc;
}
