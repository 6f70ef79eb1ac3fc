package tests

import (
	"strings"
	"sync"
	"testing"
)

// A route sends the connections a test opens with openDB and openGuarded
// through something in front of the test database (a pooler), so that an
// existing test body runs unchanged through it: a test registers a route
// for its subtests with routeTests and calls the other test functions as
// its subtests. openMonitor, the tests' own bookkeeping, is never routed.
type route struct {
	dsn map[string]string // per driver name: "pq", "pgx"
}

var routes sync.Map // test name prefix ("TestX/") → route

// routeTests routes the connections of t's subtests by dsn (per driver),
// until t ends.
func routeTests(t *testing.T, dsn map[string]string) {
	t.Helper()
	prefix := t.Name() + "/"
	routes.Store(prefix, route{dsn: dsn})
	t.Cleanup(func() { routes.Delete(prefix) })
}

// routedDSN returns the DSN through which t connects with drv: a route's,
// if one was registered for a test t is a subtest of, else the test
// database's.
func routedDSN(t testing.TB, drv string) string {
	t.Helper()
	name := t.Name()
	dsn := pgDSN
	best := 0
	routes.Range(func(k, v any) bool {
		prefix := k.(string)
		if strings.HasPrefix(name, prefix) && len(prefix) > best {
			r := v.(route)
			d, ok := r.dsn[drv]
			if !ok {
				t.Fatalf("route %s has no DSN for driver %s", prefix, drv)
			}
			dsn, best = d, len(prefix)
		}
		return true
	})
	return dsn
}
