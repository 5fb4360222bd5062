// Package events holds the public contract of dispatchmesh: the task a client
// submits, the events every service publishes, the subjects they travel on and
// the task state kept in KV. It imports only the standard library, so any Go
// client can depend on it without pulling in the mesh.
//
// Subjects (all lowercase, broad to specific, the task id always in the
// subject so one task's events can be read back with a filter):
//
//	dispatch.submit.<type>            a client's submission (raw JSON, any language)
//	dispatch.task.<id>.<stage>        one event per stage of one task
//	dispatch.review.<reason>.<id>     what needs a human (the dead-letter subjects)
//
// Every event carries its versioned name in the Dispatch-Event header and has a
// JSON Schema in package schemas.
package events
