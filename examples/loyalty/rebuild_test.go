package main

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

// TestDefaultBuildNeedsOnlySQLiteAndTheInProcessBroker: the first command,
// go run ./examples/loyalty, compiles the demo's default build, whose
// packages outside the standard library are the core's, SQLite's and the
// in-process broker's (the rabbitmq adapter and amqp091-go) and what they
// import: no broker's client, no other driver.
func TestDefaultBuildNeedsOnlySQLiteAndTheInProcessBroker(t *testing.T) {
	t.Parallel()
	deps := func(pkgs ...string) map[string]bool {
		t.Helper()
		out, err := exec.Command("go", append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}"}, pkgs...)...).Output()
		if err != nil {
			t.Fatalf("go list -deps %v: %v", pkgs, err)
		}
		m := map[string]bool{}
		for _, p := range strings.Fields(string(out)) {
			m[p] = true
		}
		return m
	}
	const mod = "github.com/txclaim/idempotent"
	allowed := deps(mod, mod+"/adapter", mod+"/sqlite", mod+"/rabbitmq")
	var extra []string
	for p := range deps(".") {
		if !allowed[p] && p != mod+"/examples/loyalty" {
			extra = append(extra, p)
		}
	}
	if len(extra) > 0 {
		t.Errorf("the default build of the demo imports %d packages beyond the core, SQLite and the in-process broker: %v", len(extra), extra)
	}
}

// TestRunBuildsWhatItLacks: a run that needs a part outside this build is
// handed to rebuildAndRun with the tags of every part it needs, and the
// same arguments; one that needs none is not.
func TestRunBuildsWhatItLacks(t *testing.T) {
	// Not parallel: it takes parts out of the maps, and puts them back.
	saved, savedBrokers, savedDBs, savedHTTP := rebuildAndRun, map[string]brokerMode{}, map[string]database{}, httpDemo
	for k, v := range brokers {
		savedBrokers[k] = v
	}
	for k, v := range databases {
		savedDBs[k] = v
	}
	t.Cleanup(func() { rebuildAndRun, brokers, databases, httpDemo = saved, savedBrokers, savedDBs, savedHTTP })
	brokers = map[string]brokerMode{"memory": savedBrokers["memory"], "rabbitmq": savedBrokers["rabbitmq"]}
	databases = map[string]database{"sqlite": savedDBs["sqlite"]}
	httpDemo = nil

	var gotTags, gotArgs []string
	rebuildAndRun = func(_ context.Context, tags, args []string, _, _ io.Writer) int {
		gotTags, gotArgs = tags, args
		return 7
	}
	for _, tc := range []struct {
		args []string
		tags []string
	}{
		{[]string{"-broker", "kafka", "-orders", "200"}, []string{"loyalty_postgres", "loyalty_kafka"}},
		{[]string{"-broker", "nats"}, []string{"loyalty_nats"}},
		{[]string{"-broker", "redis", "-db", "root@tcp(127.0.0.1:3306)/test"}, []string{"loyalty_mysql", "loyalty_redis"}},
		{[]string{"-broker", "pubsub"}, []string{"loyalty_pubsub"}},
		{[]string{"-http"}, []string{"loyalty_http"}},
		{[]string{"-db", "postgres://postgres@127.0.0.1:5432/test", "-amqp", "amqp://guest:guest@127.0.0.1:5672/"}, []string{"loyalty_postgres"}},
	} {
		gotTags, gotArgs = nil, nil
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tc.args, &stdout, &stderr)
		if code != 7 || !reflect.DeepEqual(gotTags, tc.tags) || !reflect.DeepEqual(gotArgs, tc.args) {
			t.Errorf("%v: exit %d, rebuilt with tags %v and args %v; want exit 7 from the build with tags %v and the same args (stderr %q)",
				tc.args, code, gotTags, gotArgs, tc.tags, stderr.String())
		}
	}
	// A mistake the standard library sees is reported before any build.
	gotTags = nil
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"-broker", "nats", "-nats", "http://127.0.0.1:4222"}, &stdout, &stderr); code != 2 || gotTags != nil {
		t.Errorf("a bad -nats: exit %d, rebuilt with %v; want exit 2 and no build", code, gotTags)
	}
}
