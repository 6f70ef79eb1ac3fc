package cdkpubsub_test

import (
	"os/exec"
	"syscall"
)

// killWithParent has the kernel kill cmd when the test binary exits.
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
