package tests

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/internal/testenv"
)

// A Go code block of the documentation, as the test found it.
type docBlock struct {
	file  string   // relative to the repository root: "README.md", "docs/outbox.md"
	line  int      // the line of the opening fence
	words []string // the info string after "go": "fragment", "nocompile"
	body  string   // the code, without the fences
}

// fragmentGivens are the names a fragment may use without declaring them:
// the wrapper function's parameters (docs/development.md lists them).
const fragmentGivens = "ctx context.Context, db *sql.DB, mw *idempotent.Middleware"

// knownImports maps the package names a fragment may use without importing
// them to their import paths. A fragment that uses another package
// imports it itself, in an import declaration at its top.
var knownImports = map[string]string{
	"bytes":       "bytes",
	"context":     "context",
	"driver":      "database/sql/driver",
	"errors":      "errors",
	"fmt":         "fmt",
	"http":        "net/http",
	"json":        "encoding/json",
	"log":         "log",
	"os":          "os",
	"signal":      "os/signal",
	"sql":         "database/sql",
	"strings":     "strings",
	"testing":     "testing",
	"time":        "time",
	"pgx":         "github.com/jackc/pgx/v5",
	"pgxpool":     "github.com/jackc/pgx/v5/pgxpool",
	"pq":          "github.com/lib/pq",
	"sqlmock":     "github.com/DATA-DOG/go-sqlmock",
	"sqlx":        "github.com/jmoiron/sqlx",
	"idempotent":  "github.com/txclaim/idempotent",
	"dialect":     "github.com/txclaim/idempotent/dialect",
	"dialecttest": "github.com/txclaim/idempotent/dialect/dialecttest",
	"idempgx":     "github.com/txclaim/idempotent/idempgx",
	"idemhttp":    "github.com/txclaim/idempotent/idemhttp",
	"pgxhttp":     "github.com/txclaim/idempotent/idemhttp/pgxhttp",
	"idemsqlx":    "github.com/txclaim/idempotent/idemsqlx",
	"migrations":  "github.com/txclaim/idempotent/migrations",
	"mocks":       "github.com/txclaim/idempotent/mocks",
	"mysql":       "github.com/txclaim/idempotent/mysql",
	"outbox":      "github.com/txclaim/idempotent/outbox",
	"postgres":    "github.com/txclaim/idempotent/postgres",
	"rabbitmq":    "github.com/txclaim/idempotent/rabbitmq",
	"sqlite":      "github.com/txclaim/idempotent/sqlite",
}

// fence matches a Markdown code fence, maybe indented (inside a list), and
// its info string.
var fence = regexp.MustCompile("^[ \t]*```[ \t]*(.*)$")

// TestDocsCompile compiles every ```go block of README.md and docs/*.md
// against the workspace, so that what a reader pastes compiles. A block
// whose code opens with a package clause is a whole file (blocks of one
// Markdown file with the same package make one package, named by a first
// "// name.go" comment); a block marked ```go fragment is statements, or
// declarations, wrapped in a function taking fragmentGivens, with the
// imports of knownImports it uses added; ```go nocompile is left out and
// must say why in the text (it needs a module outside the workspace). The
// error of each block that does not compile is reported at its Markdown
// file and line.
func TestDocsCompile(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		testenv.Unavailable(t, "the go tool is not on PATH: %v", err)
		return
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	blocks := readDocBlocks(t, root)
	if len(blocks) == 0 {
		t.Fatal("no ```go blocks found: is the test run from the tests directory?")
	}

	dir := t.TempDir()
	packages := map[string][]docBlock{} // package directory → its blocks
	var order []string
	add := func(pkg string, b docBlock) {
		if _, ok := packages[pkg]; !ok {
			order = append(order, pkg)
		}
		packages[pkg] = append(packages[pkg], b)
	}
	skipped := 0
	for _, b := range blocks {
		switch {
		case slices.Contains(b.words, "nocompile"):
			skipped++
			continue
		case slices.Contains(b.words, "fragment"):
			src, err := wrapFragment(root, b)
			if err != nil {
				t.Errorf("%s:%d: %v", b.file, b.line, err)
				continue
			}
			pkg := blockDir(b.file, b.line)
			writeFile(t, filepath.Join(dir, pkg, "fragment.go"), src)
			add(pkg, b)
		default:
			name := packageName(b.body)
			if name == "" {
				t.Errorf("%s:%d: a ```go block is a whole file (opening with a package clause) or is marked ```go fragment", b.file, b.line)
				continue
			}
			pkg := blockDir(b.file, 0) + "_" + name
			file := fmt.Sprintf("block%d.go", b.line)
			if m := regexp.MustCompile(`^// (\w+\.go)\n`).FindStringSubmatch(b.body); m != nil {
				file = m[1]
			}
			writeFile(t, filepath.Join(dir, pkg, file), lineDirective(root, b)+b.body)
			add(pkg, b)
		}
	}

	// The module of the snippets joins the repository's workspace: a
	// go.work of its own listing it and every module of the repository's.
	writeFile(t, filepath.Join(dir, "go.mod"), "module docsnippets\n\ngo 1.26.0\n")
	list := exec.Command(goTool, "list", "-m", "-f", "{{.Dir}}")
	list.Dir = root
	mods, err := list.Output()
	if err != nil {
		t.Fatalf("go list -m in %s: %v", root, err)
	}
	work := "go 1.26.0\n\nuse (\n\t.\n"
	for _, m := range strings.Fields(string(mods)) {
		work += "\t" + strconv.Quote(m) + "\n"
	}
	writeFile(t, filepath.Join(dir, "go.work"), work+")\n")
	if sum, err := os.ReadFile(filepath.Join(root, "go.work.sum")); err == nil {
		writeFile(t, filepath.Join(dir, "go.work.sum"), string(sum))
	}

	// go vet type-checks test files too, without linking; unreachable is
	// off because a fragment's wrapper ends in "return nil" after the
	// fragment's own return.
	vet := exec.Command(goTool, "vet", "-unreachable=false", "./...")
	vet.Dir = dir
	vet.Env = append(os.Environ(), "GOWORK="+filepath.Join(dir, "go.work"), "GOFLAGS=-buildvcs=false")
	out, err := vet.CombinedOutput()
	compiled := 0
	for _, bs := range packages {
		compiled += len(bs)
	}
	t.Logf("%d go blocks in %d packages, %d marked nocompile", compiled, len(order), skipped)
	if err == nil {
		return
	}
	// Group the output by package ("# docsnippets/<dir>" opens each) and
	// report it at the package's first block.
	text := strings.ReplaceAll(string(out), root+string(filepath.Separator), "")
	text = strings.ReplaceAll(text, dir+string(filepath.Separator), "")
	text = regexp.MustCompile(`(?m)^# \[docsnippets/.*\n`).ReplaceAllString(text, "")
	sections := regexp.MustCompile(`(?m)^# docsnippets/`).Split(text, -1)
	sort.Strings(sections[1:])
	reported := false
	for _, s := range sections[1:] {
		pkg, msg, _ := strings.Cut(s, "\n")
		bs, ok := packages[strings.TrimSpace(pkg)]
		if !ok {
			continue
		}
		reported = true
		where := make([]string, len(bs))
		for i, b := range bs {
			where[i] = fmt.Sprintf("%s:%d", b.file, b.line)
		}
		t.Errorf("the ```go block at %s does not compile:\n%s", strings.Join(where, ", "), strings.TrimSpace(msg))
	}
	if !reported {
		t.Errorf("go vet of the documentation's Go blocks failed: %v\n%s", err, text)
	}
}

// readDocBlocks returns the ```go blocks of README.md and docs/*.md, and
// fails the test for a fence left open or an info-string word it does not
// know.
func readDocBlocks(t *testing.T, root string) []docBlock {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	var blocks []docBlock
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, file)
		rel = filepath.ToSlash(rel)
		var cur *docBlock
		var body strings.Builder
		var indent string
		for i, line := range strings.Split(string(text), "\n") {
			m := fence.FindStringSubmatch(line)
			if cur == nil {
				if m == nil {
					continue
				}
				words := strings.Fields(m[1])
				indent = line[:len(line)-len(strings.TrimLeft(line, " \t"))]
				cur = &docBlock{file: rel, line: i + 1}
				if len(words) > 0 && words[0] == "go" {
					cur.words = words[1:]
					for _, w := range cur.words {
						if w != "fragment" && w != "nocompile" {
							t.Errorf("%s:%d: unknown word %q in the info string: want ```go, ```go fragment or ```go nocompile", rel, i+1, w)
						}
					}
				} else {
					cur.words = []string{"not go"}
				}
				body.Reset()
				continue
			}
			if m != nil && strings.TrimSpace(m[1]) == "" {
				if len(cur.words) == 0 || cur.words[0] != "not go" {
					cur.body = body.String()
					blocks = append(blocks, *cur)
				}
				cur = nil
				continue
			}
			body.WriteString(strings.TrimPrefix(line, indent))
			body.WriteString("\n")
		}
		if cur != nil {
			t.Errorf("%s:%d: code fence never closed", rel, cur.line)
		}
	}
	return blocks
}

// packageName returns the package clause's name when code opens with one
// (after comments), and "" otherwise.
func packageName(code string) string {
	f, err := parser.ParseFile(token.NewFileSet(), "", code, parser.PackageClauseOnly)
	if err != nil {
		return ""
	}
	return f.Name.Name
}

// wrapFragment returns a file holding b's code: its import declarations at
// the top, its declarations as they are, or its statements as the body of
// a function taking fragmentGivens; with the imports of knownImports it
// uses and does not import.
func wrapFragment(root string, b docBlock) (string, error) {
	imports, rest := splitImports(b.body)
	importsLines := strings.Count(imports, "\n")
	pos := docBlock{file: b.file, line: b.line + importsLines}
	// Declarations (a func, a type) compile at file level; anything else
	// is a function's body.
	asDecls := "package p\n\n" + imports + "\n" + lineDirective(root, pos) + rest
	fset := token.NewFileSet()
	src := asDecls
	f, err := parser.ParseFile(fset, "", asDecls, 0)
	if err != nil {
		// The fragment is a block of its own, so that it may declare
		// a db or mw of its own in place of the givens.
		src = "package p\n\n" + imports + "\nfunc _(" + fragmentGivens + ") error {\n{\n" + lineDirective(root, pos) + rest + "}\nreturn nil\n}\n"
		if f, err = parser.ParseFile(fset, "", src, 0); err != nil {
			return "", fmt.Errorf("neither declarations nor statements: %v", err)
		}
	}
	have := map[string]bool{}
	for _, im := range f.Imports {
		path, _ := strconv.Unquote(im.Path.Value)
		name := path[strings.LastIndex(path, "/")+1:]
		for n, p := range knownImports {
			if p == path {
				name = n
			}
		}
		if im.Name != nil {
			name = im.Name.Name
		}
		have[name] = true
	}
	need := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Obj == nil && knownImports[id.Name] != "" && !have[id.Name] {
				need[id.Name] = true
			}
		}
		return true
	})
	var added []string
	for name := range need {
		added = append(added, strconv.Quote(knownImports[name]))
	}
	sort.Strings(added)
	if len(added) == 0 {
		return src, nil
	}
	return strings.Replace(src, "package p\n\n", "package p\n\nimport (\n\t"+strings.Join(added, "\n\t")+"\n)\n\n", 1), nil
}

// splitImports splits code into its leading import declarations (with the
// comments and blank lines among them) and the rest.
func splitImports(code string) (imports, rest string) {
	lines := strings.SplitAfter(code, "\n")
	i, inBlock := 0, false
	for ; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		switch {
		case inBlock:
			inBlock = l != ")"
		case strings.HasPrefix(l, "import ("):
			inBlock = true
		case strings.HasPrefix(l, "import "), l == "", strings.HasPrefix(l, "//"):
		default:
			return strings.Join(lines[:i], ""), strings.Join(lines[i:], "")
		}
	}
	return code, ""
}

// lineDirective returns a //line comment making the next line b's first
// code line in its Markdown file, so the compiler's errors name the
// Markdown file and line.
func lineDirective(root string, b docBlock) string {
	return fmt.Sprintf("//line %s:%d\n", filepath.Join(root, filepath.FromSlash(b.file)), b.line+1)
}

// blockDir returns the directory name of the package for the block at line
// of file: "docs_outbox_md_l47".
func blockDir(file string, line int) string {
	name := strings.NewReplacer("/", "_", ".", "_", "-", "_").Replace(strings.ToLower(file))
	if line > 0 {
		name += "_l" + strconv.Itoa(line)
	}
	return name
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDocsGoVersions checks docs/development.md's table of Go versions
// against the go line of every module of the workspace, and the README's
// statement of the core's.
func TestDocsGoVersions(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		testenv.Unavailable(t, "the go tool is not on PATH: %v", err)
		return
	}
	list := exec.Command(goTool, "list", "-m", "-f", "{{.Path}} {{.GoVersion}}")
	list.Dir = ".."
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	want := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, version, _ := strings.Cut(line, " ")
		want[path] = version
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "development.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(github\\.com/txclaim/idempotent[^`]*)` \\| ([^|]*) \\|")
	got := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		got[m[1]] = strings.TrimSpace(m[2])
	}
	for path, version := range want {
		switch g, ok := got[path]; {
		case !ok:
			t.Errorf("docs/development.md: module %s (go %s) is not in the Go versions table", path, version)
		case g != version:
			t.Errorf("docs/development.md: module %s: the table says Go %s, its go.mod says go %s", path, g, version)
		}
	}
	for path := range got {
		if _, ok := want[path]; !ok {
			t.Errorf("docs/development.md: the Go versions table lists %s, which is not a module of the workspace", path)
		}
	}
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	core := want["github.com/txclaim/idempotent"]
	if !strings.Contains(string(readme), "needs Go "+core+" or later") {
		t.Errorf("README.md does not say the core module needs Go %s or later", core)
	}
}
