package client

// StreamForTest is the stream the client reads task events from.
const StreamForTest = stream
