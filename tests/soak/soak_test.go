package main

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent/tests/internal/pgcluster"
)

// TestMain lets the test binary serve as the soak's consumer processes:
// the soak re-executes its own binary with consumerEnv set.
func TestMain(m *testing.M) {
	if os.Getenv(consumerEnv) != "" {
		os.Exit(runConsumerFromEnv())
	}
	os.Exit(m.Run())
}

// TestSoak runs the soak for a few seconds (IDEMPOTENT_SOAK_DURATION,
// default 8s; IDEMPOTENT_SOAK_SEED replays a seed) with every fault type,
// and fails on any audit failure. It needs the PostgreSQL server binaries
// to create its throwaway cluster: without them it skips, or fails when CI
// is set.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: skipped in -short mode")
	}
	if _, err := pgcluster.FindBin(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("soak needs PostgreSQL server binaries and CI is set: %v", err)
		}
		t.Skipf("soak: %v", err)
	}
	cfg := defaultSoakConfig()
	cfg.Duration = 8 * time.Second
	cfg.Consumers, cfg.Workers = 2, 2
	cfg.FaultEvery = 500 * time.Millisecond
	cfg.DrainTimeout = 60 * time.Second
	if v := os.Getenv("IDEMPOTENT_SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("IDEMPOTENT_SOAK_DURATION: %v", err)
		}
		cfg.Duration = d
	}
	cfg.Seed = uint64(time.Now().UnixNano())
	if v := os.Getenv("IDEMPOTENT_SOAK_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("IDEMPOTENT_SOAK_SEED: %v", err)
		}
		cfg.Seed = seed
	}
	var out strings.Builder
	res, err := runSoak(context.Background(), cfg, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("soak could not run (seed %d): %v", cfg.Seed, err)
	}
	if !res.ok() {
		t.Fatalf("soak audit failed; replay with IDEMPOTENT_SOAK_SEED=%d or go run ./tests/soak -duration %v -seed %d:\n%s",
			cfg.Seed, cfg.Duration, cfg.Seed, strings.Join(res.problems, "\n"))
	}
}

// TestScheduleCoversEveryFault checks that every schedule, however short
// the run, holds every fault type in every lane, and that a seed always
// draws the same schedule.
func TestScheduleCoversEveryFault(t *testing.T) {
	for _, d := range []time.Duration{time.Second, 8 * time.Second, time.Minute} {
		for seed := uint64(1); seed <= 50; seed++ {
			cfg := defaultSoakConfig()
			cfg.Duration, cfg.Seed = d, seed
			a := schedule(newRand(seed, 0), cfg)
			b := schedule(newRand(seed, 0), cfg)
			if len(a) != len(b) {
				t.Fatalf("seed %d: schedules of %d and %d faults", seed, len(a), len(b))
			}
			seen := map[string]bool{}
			for i, f := range a {
				if f != b[i] {
					t.Fatalf("seed %d: fault %d differs: %+v and %+v", seed, i, f, b[i])
				}
				if f.at < 0 || f.at >= d {
					t.Fatalf("seed %d: fault at %v outside the run of %v", seed, f.at, d)
				}
				seen[f.kind+"/"+f.lane] = true
			}
			for _, k := range faultKinds {
				if globalFault(k) {
					if !seen[k+"/"] {
						t.Fatalf("seed %d, %v: no %s scheduled", seed, d, k)
					}
					continue
				}
				for _, l := range lanes {
					if !seen[k+"/"+l.name] {
						t.Fatalf("seed %d, %v: no %s in lane %s", seed, d, k, l.name)
					}
				}
			}
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for name, mutate := range map[string]func(*soakConfig){
		"zero duration": func(c *soakConfig) { c.Duration = 0 },
		"no consumers":  func(c *soakConfig) { c.Consumers = 0 },
		"dup too high":  func(c *soakConfig) { c.DupShare = 0.95 },
		"dup negative":  func(c *soakConfig) { c.DupShare = -0.1 },
		"zero rate":     func(c *soakConfig) { c.Rate = 0 },
	} {
		cfg := defaultSoakConfig()
		mutate(&cfg)
		if err := cfg.validate(); err == nil {
			t.Errorf("%s: validate accepted %+v", name, cfg)
		}
	}
	if err := defaultSoakConfig().validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	if _, err := runSoak(context.Background(), soakConfig{}, &strings.Builder{}); err == nil || errors.Is(err, pgcluster.ErrNoPostgres) {
		t.Fatalf("runSoak with a zero config: %v, want a validation error", err)
	}
}
