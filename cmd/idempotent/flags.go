package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/txclaim/idempotent"
)

// helpShown says -h was given and the command's flags were printed.
type helpShown struct{}

func (helpShown) Error() string { return "help shown" }

// command is one subcommand's flag set and the flags most commands share.
type command struct {
	fs    *flag.FlagSet
	e     env
	dsn   string
	table string
	help  func()
	// creates says the command may create the SQLite file it is given.
	creates bool
}

func newCommand(name, summary string, e env, db bool) *command {
	c := &command{fs: flag.NewFlagSet(name, flag.ContinueOnError), e: e}
	c.fs.SetOutput(io.Discard)
	c.fs.Usage = func() {}
	c.fs.StringVar(&c.table, "table", idempotent.DefaultTable, `claim table, "table" or "schema.table"`)
	if db {
		c.fs.StringVar(&c.dsn, "dsn", "", dsnHelp)
	}
	c.help = func() {
		fmt.Fprintf(e.stdout, "Usage: idempotent %s [flags]\n\n%s\n\nFlags:\n", name, summary)
		c.fs.SetOutput(e.stdout)
		c.fs.PrintDefaults()
		c.fs.SetOutput(io.Discard)
	}
	return c
}

// parse parses args, turning every problem into a usageError.
func (c *command) parse(args []string) error {
	if err := c.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.help()
			return helpShown{}
		}
		return usageError{err.Error()}
	}
	if c.fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", c.fs.Arg(0))}
	}
	return nil
}

// firstError returns the first non-nil error.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// positive rejects a flag value below min.
func positive(flagName string, v, min int) error {
	if v < min {
		return usageError{fmt.Sprintf("-%s is %d, want at least %d", flagName, v, min)}
	}
	return nil
}

// checkDuration rejects a negative duration, or a zero one unless zeroOK.
func checkDuration(flagName string, d time.Duration, zeroOK bool) error {
	if d < 0 || (d == 0 && !zeroOK) {
		return usageError{fmt.Sprintf("-%s is %v, want a positive duration", flagName, d)}
	}
	return nil
}

// days is a duration flag that also takes days: "30d", "1d12h", "36h".
type days struct {
	d   time.Duration
	set bool
}

func (v *days) String() string {
	if v == nil || !v.set {
		return ""
	}
	return formatDays(v.d)
}

func (v *days) Set(s string) error {
	d, err := parseDays(s)
	if err != nil {
		return err
	}
	v.d, v.set = d, true
	return nil
}

// parseDays parses a Go duration, optionally preceded by a whole number of
// days ("30d", "1d12h").
func parseDays(s string) (time.Duration, error) {
	var total time.Duration
	rest := s
	if i := strings.IndexByte(s, 'd'); i >= 0 {
		n, err := strconv.Atoi(s[:i])
		if err != nil || n < 0 || n > 100_000 {
			return 0, fmt.Errorf("%q is not a duration (want for example 30d, 36h or 1d12h)", s)
		}
		total = time.Duration(n) * 24 * time.Hour
		rest = s[i+1:]
	}
	if rest != "" {
		d, err := time.ParseDuration(rest)
		if err != nil {
			return 0, fmt.Errorf("%q is not a duration (want for example 30d, 36h or 1d12h)", s)
		}
		total += d
	}
	return total, nil
}

// formatDays prints whole days as "30d" and anything else as Go does.
func formatDays(d time.Duration) string {
	day := 24 * time.Hour
	if d >= day && d%day == 0 {
		return fmt.Sprintf("%dd", d/day)
	}
	if d > day {
		return fmt.Sprintf("%dd%s", d/day, shortDuration(d%day))
	}
	return shortDuration(d)
}

// shortDuration drops Go's trailing zero units: 5m, not 5m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// humanBytes prints a size in B, kB, MB or GB (powers of 1024).
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, suffix := float64(n), []string{"kB", "MB", "GB", "TB"}
	i := -1
	for v >= unit && i < len(suffix)-1 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %s", v, suffix[i])
}
