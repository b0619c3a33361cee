package consumer

// ServeOne claims one operator request and carries it out, for tests that
// must run a request at a point of their choosing.
var ServeOne = (*Processor).serveOne
