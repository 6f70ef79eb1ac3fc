//go:build !linux

package cdkpubsub_test

import "os/exec"

// killWithParent does nothing here: a moto_server the tests started
// outlives them; stop it by hand.
func killWithParent(*exec.Cmd) {}
