// Submit a task to dispatchmesh from Node.js, wait for its outcome, print it.
//   npm ci && node submit.mjs ['{"type":"css_fix","subject":"src/app.css"}']
// NATS_URL says where `dispatch up` listens (default nats://127.0.0.1:4222).
// As a user of deploy/ (the `client` user): NATS_USER, NATS_PASSWORD, and
// NATS_INBOX_PREFIX=_INBOX.client, the only inbox it may read.
import { connect, JSONCodec } from "nats";

const task = process.argv[2] ??
  JSON.stringify({ type: "css_fix", subject: "src/app.css", payload: { issue: "button misaligned" } });
const { NATS_URL, NATS_USER, NATS_PASSWORD, NATS_INBOX_PREFIX } = process.env;
const nc = await connect({
  servers: NATS_URL ?? "nats://127.0.0.1:4222",
  user: NATS_USER, pass: NATS_PASSWORD, inboxPrefix: NATS_INBOX_PREFIX, // unset: no user, the default _INBOX
});
const jc = JSONCodec();

// Every answer is JSON; a failed one is {"error": {"code", "message", "problems"}}.
async function ask(subject, body, timeout) {
  const answer = jc.decode((await nc.request(subject, body, { timeout })).data);
  if (answer.error) throw answer.error;
  return answer;
}

try {
  const { id } = await ask("dispatch.api.submit", task, 5000);
  console.log(`submitted ${id}, waiting`);
  // Answered once the task is terminal (or after "timeout", with where it is).
  const out = await ask("dispatch.api.wait", JSON.stringify({ id, timeout: "60s" }), 65000);
  console.log(`${out.id} ${out.status} after ${out.attempts} attempt(s), $${out.cost.toFixed(4)}` +
    (out.timed_out ? `, still at ${out.stage}` : ""));
  if (out.result) console.log(`answer: ${out.result.summary}`);
  if (out.reason) console.log(`reason: ${out.reason}`);
  process.exitCode = out.status === "succeeded" ? 0 : 1;
} catch (err) {
  if (err.problems) console.error(`error ${err.code}: ${err.message}\n` + err.problems.map((p) => `  - ${p}`).join("\n"));
  else console.error(err);
  process.exitCode = 1;
} finally {
  await nc.close();
}
