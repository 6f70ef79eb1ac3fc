package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// readBuildInfo is debug.ReadBuildInfo (a variable for the tests).
var readBuildInfo = debug.ReadBuildInfo

func cmdVersion(_ context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := &command{fs: fs, e: e, help: func() {
		fmt.Fprint(e.stdout, "Usage: idempotent version\n\nPrints the command's module version (devel when it was built without one), the Go\nversion it was built with, and the system it runs on.\n")
	}}
	if err := c.parse(args); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, versionLine())
	return nil
}

// versionLine is "idempotent VERSION GOVERSION OS/ARCH": the main module's
// version as the go command stamped it ("v1.2.0" from go install …@v1.2.0,
// a pseudo-version from a git checkout), or devel when there is none.
func versionLine() string {
	version, goVersion := "devel", runtime.Version()
	if info, ok := readBuildInfo(); ok {
		if v := info.Main.Version; v != "" && v != "(devel)" {
			version = v
		}
		if info.GoVersion != "" {
			goVersion = info.GoVersion
		}
	}
	return fmt.Sprintf("idempotent %s %s %s/%s", version, goVersion, runtime.GOOS, runtime.GOARCH)
}
