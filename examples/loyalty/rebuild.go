package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// rebuiltEnv marks a binary started by rebuildAndRun, so that a build that
// still lacks a part fails instead of building again.
const rebuiltEnv = "LOYALTY_DEMO_REBUILT"

// rebuildAndRun is run for a run that needs parts this binary lacks: it
// says so, builds the demo with tags (go build, from the demo's source
// directory), runs that binary with the same arguments, standard input and
// output, and returns its exit status. The build of a part's client takes
// a minute or more the first time, in which the go command prints nothing;
// later builds find it in the build cache and take seconds.
var rebuildAndRun = func(ctx context.Context, tags, args []string, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "loyalty: %s\n", oneLine(err))
		return 1
	}
	if os.Getenv(rebuiltEnv) != "" {
		return fail(fmt.Errorf("built with -tags %s and still without a part it needs", strings.Join(tags, ",")))
	}
	dir, err := sourceDir()
	if err != nil {
		return fail(err)
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return fail(fmt.Errorf("this run needs a build with -tags %s, and no go command is on PATH: %w", strings.Join(tags, ","), err))
	}
	var names []string
	for _, tag := range tags {
		for part, t := range partTags {
			if t == tag {
				names = append(names, partNames[part])
			}
		}
	}
	them := "it"
	if len(names) > 1 {
		them = "them"
	}
	fmt.Fprintf(stdout, "loyalty: this run needs %s, which the default build leaves out: building the demo with %s (go build -tags %s;\n"+
		"         the first time it compiles %[2]s, a minute or more with nothing printed; then seconds)\n",
		strings.Join(names, " and "), them, strings.Join(tags, ","))
	tmp, err := os.MkdirTemp("", "loyalty-build-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "loyalty")
	build := exec.CommandContext(ctx, goCmd, "build", "-tags", strings.Join(tags, ","), "-o", bin, ".")
	build.Dir, build.Stdout, build.Stderr = dir, stderr, stderr
	if err := build.Run(); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "\nloyalty: interrupted")
			return 130
		}
		return fail(fmt.Errorf("go build -tags %s in %s: %w", strings.Join(tags, ","), dir, err))
	}
	// Not CommandContext: an interrupt reaches the demo from the terminal,
	// and it drops its tables before it ends.
	demo := exec.Command(bin, args...)
	demo.Stdin, demo.Stdout, demo.Stderr = os.Stdin, stdout, stderr
	demo.Env = append(os.Environ(), rebuiltEnv+"=1")
	err = demo.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		return exit.ExitCode()
	case ctx.Err() != nil:
		return 130
	}
	return fail(err)
}

// sourceDir is the demo's source directory, where go build finds the
// package and the workspace.
func sourceDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if ok {
		dir := filepath.Dir(file)
		if _, err := os.Stat(filepath.Join(dir, "main.go")); err == nil {
			return dir, nil
		}
	}
	return "", errors.New("this run needs the demo's source to build it with the parts it lacks: run it with go run ./examples/loyalty from the repository")
}
