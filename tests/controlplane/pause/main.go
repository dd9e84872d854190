// kcover-pause: the process of the `node` test backend's pod sandbox image (containerd's sandbox_image).
//
// What a pause container does: hold the pod's namespaces open, reap the zombies of processes that were
// re-parented to it (it is PID 1 when the pod shares its PID namespace), and exit when told to stop.
// Built by tests/controlplane/build-node.sh; packed into a scratch image by tests/controlplane/images.py.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
