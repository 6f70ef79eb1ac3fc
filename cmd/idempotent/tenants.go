package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
)

// tenantsHelp is the -tenants flag's help, for stats, cleanup and
// partitions.
const tenantsHelp = `file of tenant databases, one "name=DSN" a line (# comments): run the command on each, in turn (instead of -dsn)`

// tenantDB is one line of a -tenants file.
type tenantDB struct {
	name, dsn string
	line      int
}

// readTenants reads a -tenants file: one "name=DSN" a line, blank lines
// and lines starting with # ignored. A name is unique and has no spaces; a
// bad line (a connection string that does not parse, too) is an error
// naming the line, and nothing runs.
func readTenants(path string) ([]tenantDB, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usageError{fmt.Sprintf("-tenants: %v", err)}
	}
	defer f.Close()
	var out []tenantDB
	seen := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, dsn, ok := strings.Cut(line, "=")
		name, dsn = strings.TrimSpace(name), strings.TrimSpace(dsn)
		switch {
		case !ok || name == "" || dsn == "":
			return nil, usageError{fmt.Sprintf("-tenants %s line %d: want name=DSN", path, n)}
		case strings.ContainsAny(name, " \t"):
			return nil, usageError{fmt.Sprintf("-tenants %s line %d: tenant name %q has a space", path, n, name)}
		case seen[name] > 0:
			return nil, usageError{fmt.Sprintf("-tenants %s line %d: tenant %q already on line %d", path, n, name, seen[name])}
		}
		if _, err := classify(dsn); err != nil {
			// What the string holds is not known, so none of it is shown.
			return nil, usageError{fmt.Sprintf("-tenants %s line %d: tenant %s: bad connection string", path, n, name)}
		}
		seen[name] = n
		out = append(out, tenantDB{name: name, dsn: dsn, line: n})
	}
	if err := sc.Err(); err != nil {
		return nil, usageError{fmt.Sprintf("-tenants %s: %v", path, err)}
	}
	if len(out) == 0 {
		return nil, usageError{fmt.Sprintf("-tenants %s: no tenants", path)}
	}
	return out, nil
}

// tenantsArg finds the -tenants flag in args (-tenants F, -tenants=F, and
// the same with --), and returns its value and args without it. It is
// looked for before the command parses its flags, up to a "--".
func tenantsArg(args []string) (path string, rest []string, found bool, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue // a flag's value: these commands take no arguments
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name != "tenants" {
			continue
		}
		if !hasValue {
			if i+1 == len(args) {
				return "", nil, true, usageError{"flag needs an argument: -tenants"}
			}
			value = args[i+1]
			rest = append(append(rest, args[:i]...), args[i+2:]...)
		} else {
			rest = append(append(rest, args[:i]...), args[i+1:]...)
		}
		if value == "" {
			return "", nil, true, usageError{"-tenants: empty file name"}
		}
		return value, rest, true, nil
	}
	return "", args, false, nil
}

// forEachTenant runs command run once per tenant of the -tenants file in
// args, each time with the tenant's DSN as -dsn, under a line naming the
// tenant. A tenant that fails does not stop the others; the failures are
// returned together, each naming its tenant. ok is false when args have no
// -tenants flag: the caller then runs as usual. -tenants with -dsn (or
// without a file) is a usage error, and nothing runs.
func forEachTenant(ctx context.Context, args []string, e env, run func(context.Context, []string, env) error) (ok bool, err error) {
	path, rest, found, err := tenantsArg(args)
	if !found {
		return false, nil
	}
	if err != nil {
		return true, err
	}
	for _, a := range rest {
		if a == "--" {
			break
		}
		if name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); name == "dsn" {
			return true, usageError{"-tenants and -dsn: give one of them (each line of the -tenants file names its tenant's database)"}
		}
	}
	tenants, err := readTenants(path)
	if err != nil {
		return true, err
	}
	var errs []error
	for i, t := range tenants {
		if err := ctx.Err(); err != nil {
			return true, errors.Join(append(errs, err)...)
		}
		if i > 0 {
			fmt.Fprintln(e.stdout)
		}
		fmt.Fprintf(e.stdout, "== tenant %s\n", t.name)
		err := run(ctx, append([]string{"-dsn", t.dsn}, rest...), e)
		var u usageError
		if errors.As(err, &u) && i == 0 {
			// Every DSN was checked: a usage error is the flags', the
			// same for every tenant, and nothing was sent.
			return true, err
		}
		if err != nil {
			fmt.Fprintf(e.stdout, "tenant %s failed: %v\n", t.name, err)
			errs = append(errs, fmt.Errorf("tenant %s: %w", t.name, err))
		}
	}
	if len(errs) > 0 {
		return true, fmt.Errorf("%d of %d tenants failed: %w", len(errs), len(tenants), errors.Join(errs...))
	}
	return true, nil
}
