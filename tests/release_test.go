package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// TestReleaseGoGettable releases a copy of the repository with
// scripts/release, serves every tagged module from a file-based module
// proxy (GOPROXY=file://…, the zips made as the go command's proxy makes
// them, with golang.org/x/mod/zip), and builds a fresh consumer module
// with plain `go get …@v0.9.0` of the core and three adapters: no
// replace directive, no workspace. The other modules come from the local
// module cache, read as a proxy too, into a module cache of the test's
// own.
func TestReleaseGoGettable(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds a consumer from scratch")
	}
	t.Parallel()
	const version = "v0.9.0"
	repo := copyRepository(t)
	run := func(dir string, env []string, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	git := []string{"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com"}
	run(repo, git, "git", "init", "-q")
	run(repo, git, "git", "add", "-A")
	run(repo, git, "git", "commit", "-q", "-m", "the tree under test")
	t.Log(run(repo, git, "bash", "scripts/release", version))

	// The proxy: one directory per tagged module.
	proxy := t.TempDir()
	var published []string
	for _, tag := range strings.Fields(run(repo, nil, "git", "tag", "--list")) {
		dir := strings.TrimSuffix(strings.TrimSuffix(tag, version), "/")
		if dir == "" {
			dir = "."
		}
		gomod, err := os.ReadFile(filepath.Join(repo, dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		path := strings.TrimSpace(strings.TrimPrefix(strings.SplitN(string(gomod), "\n", 2)[0], "module"))
		if strings.Contains(string(gomod), "\nreplace") {
			t.Errorf("%s@%s: its go.mod keeps a replace directive", path, version)
		}
		published = append(published, path)
		esc, err := module.EscapePath(path)
		if err != nil {
			t.Fatal(err)
		}
		at := filepath.Join(proxy, esc, "@v")
		if err := os.MkdirAll(at, 0o755); err != nil {
			t.Fatal(err)
		}
		var zip bytes.Buffer
		if err := modzip.CreateFromDir(&zip, module.Version{Path: path, Version: version}, filepath.Join(repo, dir)); err != nil {
			t.Fatalf("zip of %s: %v", path, err)
		}
		info, _ := json.Marshal(map[string]any{"Version": version, "Time": time.Now().UTC().Format(time.RFC3339)})
		for name, b := range map[string][]byte{"list": []byte(version + "\n"), version + ".info": info, version + ".mod": gomod, version + ".zip": zip.Bytes()} {
			if err := os.WriteFile(filepath.Join(at, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(published) < 10 {
		t.Fatalf("scripts/release tagged %d modules: %v", len(published), published)
	}

	// The consumer: the core with Postgres, and three adapters.
	consumer := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/consumer\n\ngo 1.26.0\n",
		"main.go": `package main

import (
	"database/sql"

	_ "github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idemsqlx"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/rabbitmq"
)

func main() {
	db, _ := sql.Open("postgres", "")
	mw, _ := idempotent.New(db, postgres.New(), "consumer")
	_ = idemsqlx.ProcessMessage
	_ = kafka.NewConsumer
	_ = rabbitmq.NewConsumer
	_ = mw
}
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(consumer, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cache := strings.TrimSpace(run(consumer, []string{"GOWORK=off"}, "go", "env", "GOMODCACHE"))
	env := []string{
		"GOWORK=off", "GOFLAGS=-modcacherw", "GOSUMDB=off", "GOTOOLCHAIN=local",
		"GOPROXY=file://" + filepath.ToSlash(proxy) + ",file://" + filepath.ToSlash(filepath.Join(cache, "cache", "download")) + ",https://proxy.golang.org",
		"GOMODCACHE=" + t.TempDir(),
	}
	mod := "github.com/txclaim/idempotent"
	run(consumer, env, "go", "get", mod+"@"+version, mod+"/idemsqlx@"+version, mod+"/kafka@"+version, mod+"/rabbitmq@"+version, "github.com/lib/pq")
	run(consumer, env, "go", "build", "-o", os.DevNull, ".")
	got := run(consumer, env, "go", "list", "-m", mod, mod+"/idemsqlx", mod+"/kafka", mod+"/rabbitmq")
	for _, p := range []string{mod, mod + "/idemsqlx", mod + "/kafka", mod + "/rabbitmq"} {
		if !strings.Contains(got, p+" "+version+"\n") {
			t.Errorf("go list -m: %q, want %s %s", got, p, version)
		}
	}
}

// copyRepository copies the repository's files, committed or not (git
// ls-files, without what .gitignore leaves out), into a directory of the
// test's own.
func copyRepository(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", root, "ls-files", "-co", "--exclude-standard", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	dst := t.TempDir()
	for _, f := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		b, err := os.ReadFile(filepath.Join(root, f))
		if os.IsNotExist(err) {
			continue // deleted in the work tree
		}
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, st.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}
