package idemhttp

// AlwaysReadFirst makes m read every request's stored response before
// claiming, whatever its replays score: the tests of that read.
func AlwaysReadFirst(m *Middleware) { m.alwaysReadFirst = true }
