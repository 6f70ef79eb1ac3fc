package idempotent_test

import (
	"database/sql"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
)

// TestOptionKinds checks, from the functions' static types, that a
// consumer's option given to NewClaimTable does not compile while a table
// option works in New and NewClaimTable alike: NewClaimTable takes
// ...TableOption, a consumer option's constructor returns Option, and an
// Option is not a TableOption. It also checks that every With… function of
// the package is in the table below, so a new option must choose its kind.
func TestOptionKinds(t *testing.T) {
	optionType := reflect.TypeFor[idempotent.Option]()
	tableType := reflect.TypeFor[idempotent.TableOption]()
	kinds := map[string]struct {
		fn    any
		table bool
	}{
		"WithTable":           {idempotent.WithTable, true},
		"WithRetention":       {idempotent.WithRetention, true},
		"WithClockSkew":       {idempotent.WithClockSkew, true},
		"WithClock":           {idempotent.WithClock, true},
		"WithDailyPartitions": {idempotent.WithDailyPartitions, true},
		"WithRetry":           {idempotent.WithRetry, true},
		"WithTxOptions":       {idempotent.WithTxOptions, false},
		"WithLockTimeout":     {idempotent.WithLockTimeout, false},
		"WithHorizonLease":    {idempotent.WithHorizonLease, false},
		"WithObserver":        {idempotent.WithObserver, false},
		"WithStrictGuard":     {idempotent.WithStrictGuard, false},
		"WithSeen":            {idempotent.WithSeen, false},
		"WithCoalescing":      {idempotent.WithCoalescing, false},
		"WithOrdering":        {idempotent.WithOrdering, false},
	}
	if optionType.Implements(tableType) {
		t.Fatal("an Option is a TableOption: a consumer's option given to NewClaimTable would compile")
	}
	if !tableType.Implements(optionType) {
		t.Fatal("a TableOption is not an Option: New would not take the table's options")
	}
	newClaimTable := reflect.TypeOf(idempotent.NewClaimTable)
	if !newClaimTable.IsVariadic() || newClaimTable.In(newClaimTable.NumIn()-1).Elem() != tableType {
		t.Fatalf("NewClaimTable is %v, want ...TableOption last", newClaimTable)
	}
	newMiddleware := reflect.TypeOf(idempotent.New)
	if !newMiddleware.IsVariadic() || newMiddleware.In(newMiddleware.NumIn()-1).Elem() != optionType {
		t.Fatalf("New is %v, want ...Option last", newMiddleware)
	}
	for name, k := range kinds {
		out := reflect.TypeOf(k.fn).Out(0)
		want := optionType
		if k.table {
			want = tableType
		}
		if out != want {
			t.Errorf("%s returns %v, want %v", name, out, want)
		}
	}
	// Every With… function of the package has its kind above.
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var found []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "With") && fd.Name.IsExported() {
				found = append(found, fd.Name.Name)
			}
		}
	}
	for _, name := range found {
		if _, ok := kinds[name]; !ok {
			t.Errorf("%s is not in the table of option kinds", name)
		}
	}
	if len(found) != len(kinds) {
		slices.Sort(found)
		t.Errorf("the package has the options %v, the table %d", found, len(kinds))
	}
}

// Both kinds in New, table options in NewClaimTable: what compiles.
func TestTableOptionsWorkInBoth(t *testing.T) {
	db, _ := sqlmockDB(t)
	table := []idempotent.TableOption{idempotent.WithTable("shop.claims"), idempotent.WithRetention(48 * time.Hour)}
	ct, err := idempotent.NewClaimTable(db, pg, table...)
	if err != nil {
		t.Fatal(err)
	}
	opts := []idempotent.Option{idempotent.WithTxOptions(sql.TxOptions{Isolation: sql.LevelSerializable})}
	for _, o := range table {
		opts = append(opts, o)
	}
	mw, err := idempotent.New(db, pg, consumer, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := mw.ClaimTable().Name(), ct.Name(); got != want || mw.Config().Retention != ct.Retention() {
		t.Fatalf("the Middleware's table is %s (%v), the ClaimTable's %s (%v)", got, mw.Config().Retention, want, ct.Retention())
	}
}
