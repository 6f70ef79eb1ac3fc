package main

import "testing"

func TestDriverSpecs(t *testing.T) {
	for _, tc := range []struct {
		spec, dsn, want, label string
	}{
		{"pq", "postgres://u@h/db?sslmode=disable", "postgres://u@h/db?sslmode=disable", "lib/pq"},
		{"pq+binary_parameters=yes", "postgres://u@h/db?sslmode=disable", "postgres://u@h/db?binary_parameters=yes&sslmode=disable", "lib/pq (binary_parameters=yes)"},
		{"pgx+default_query_exec_mode=exec&statement_cache_capacity=64", "host=h dbname=db", "host=h dbname=db default_query_exec_mode=exec statement_cache_capacity=64", "pgx stdlib (default_query_exec_mode=exec, statement_cache_capacity=64)"},
	} {
		c, err := parseDriver(tc.spec)
		if err != nil {
			t.Fatalf("%s: %v", tc.spec, err)
		}
		got, err := c.dsn(tc.dsn)
		if err != nil || got != tc.want {
			t.Errorf("%s: dsn %q, %v; want %q", tc.spec, got, err, tc.want)
		}
		if c.label() != tc.label {
			t.Errorf("%s: label %q, want %q", tc.spec, c.label(), tc.label)
		}
	}
	for _, bad := range []string{"mysql", "pq+binary_parameters", ""} {
		if _, err := parseDriver(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
