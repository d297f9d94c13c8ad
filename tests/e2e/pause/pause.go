// Command pause is the lab's pod sandbox process: it holds the pod's namespaces open, reaps
// orphaned children (it is PID 1 of a pod sharing its PID namespace) and exits on SIGINT/SIGTERM.
// Built statically (CGO_ENABLED=0) so its image needs nothing else.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s == syscall.SIGCHLD {
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
