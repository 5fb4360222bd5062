// A tool in JavaScript: a NATS micro service the model may call while it
// works on a task (OpenAI function calling). Offer it to a type in the
// policy file (DISPATCH_POLICY_FILE):
//   {"types": {"css_fix": {"tools": [{"name": "lookup_selector", "subject": "tool.css.lookup",
//     "description": "Find where a CSS selector is defined",
//     "parameters": {"type": "object", "properties": {"selector": {"type": "string"}}, "required": ["selector"]}}]}}}
// Request: the call's arguments, as the JSON object the model wrote. Reply:
// any JSON (or text), handed to the model. respondError(4xx, …) tells the
// model its arguments were wrong (the same call is never sent again);
// 5xx, no reply or no responders mean the tool is down: the task waits
// for it (no model call, not an attempt), up to the type's tool_wait.
//   node tool.mjs      (NATS_URL: where `dispatch up` listens)
import { connect, JSONCodec } from "nats";

const nc = await connect({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" });
const jc = JSONCodec();
const service = await nc.services.add({
  name: "css_tools", version: "1.0.0", description: "Where is a CSS selector defined?",
});
service.addEndpoint("lookup_selector", {
  subject: process.env.TOOL_SUBJECT ?? "tool.css.lookup",
  handler: (err, msg) => {
    if (err) return console.error(err);
    let args;
    try {
      args = jc.decode(msg.data);
    } catch {
      return msg.respondError(400, "arguments must be a JSON object");
    }
    if (typeof args?.selector !== "string" || args.selector === "") {
      return msg.respondError(400, '"selector" (a string) is required');
    }
    // The real lookup goes here (grep the stylesheets, ask the design system…).
    msg.respond(jc.encode({ selector: args.selector, file: "src/app.css", line: 42, found_by: "the JavaScript tool" }));
  },
});
console.log(`tool ${service.info().name} listening on ${service.info().endpoints[0].subject}`);
process.on("SIGTERM", () => service.stop().then(() => nc.drain()));
await service.stopped;
await nc.close();
