// A verifier in JavaScript: a NATS micro service dispatchmesh asks, before
// every attempt, whether a task's problem still exists. Enable it for a type
// in the policy file (DISPATCH_POLICY_FILE):
//   {"types": {"css_fix": {"verifier": {"kind": "nats", "subject": "verify.css_fix"}}}}
// Request: the task JSON (id, type, subject, payload, …; `dispatch schema
// task.queued.v1`, $defs.task). Reply: {"exists": true|false, "detail": "…"}:
// false cancels the task before any model is called. An error reply, no
// reply or no responders count as a verifier failure (fail-open by default).
//   node verifier.mjs      (NATS_URL: where `dispatch up` listens)
import { connect, JSONCodec } from "nats";

const nc = await connect({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" });
const jc = JSONCodec();
const service = await nc.services.add({
  name: "css_verifier", version: "1.0.0", description: "Is the CSS problem of a task still there?",
});
service.addEndpoint("still_broken", {
  subject: process.env.VERIFY_SUBJECT ?? "verify.css_fix",
  handler: (err, msg) => {
    if (err) return console.error(err);
    let task;
    try {
      task = jc.decode(msg.data);
    } catch {
      return msg.respondError(400, "the request is not a task (JSON)");
    }
    // The real check goes here: open task.subject, fetch the page, run the test…
    // This one says a subject ending in ".fixed.css" is fixed already.
    const fixed = String(task.subject).endsWith(".fixed.css");
    msg.respond(jc.encode({
      exists: !fixed,
      detail: fixed ? `${task.subject} is fixed already` : `checked by the JavaScript verifier: ${task.subject} is still broken`,
    }));
  },
});
console.log(`verifier ${service.info().name} listening on ${service.info().endpoints[0].subject}`);
process.on("SIGTERM", () => service.stop().then(() => nc.drain()));
await service.stopped;
await nc.close();
