// Command k3s-render executes a k3s/RKE2 containerd config template with Go's text/template, the way
// k3s does at every start: the user's template may call the "base" template, and its data carries the
// runtimes k3s found on the node (ExtraRuntimes). It stands in for k3s's own generator, which cannot
// be built here: "base" is given as the config that generator wrote (it holds no actions).
//
// Usage: k3s-render BASE_FILE TEMPLATE_FILE [NAME=BINARY ...]
package main

import (
	"fmt"
	"os"
	"strings"
	"text/template"
)

type runtime struct {
	RuntimeType string
	BinaryName  string
}

type config struct {
	ExtraRuntimes map[string]runtime
	// SystemdCgroup is what k3s decides at each start (true on a systemd node); K3S_RENDER_SYSTEMD_CGROUP=false turns it off.
	SystemdCgroup bool
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: k3s-render BASE_FILE TEMPLATE_FILE [NAME=BINARY ...]")
		os.Exit(2)
	}
	base, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	text, err := os.ReadFile(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	data := config{ExtraRuntimes: map[string]runtime{}, SystemdCgroup: os.Getenv("K3S_RENDER_SYSTEMD_CGROUP") != "false"}
	for _, found := range os.Args[3:] {
		name, binary, ok := strings.Cut(found, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "not NAME=BINARY: %s\n", found)
			os.Exit(2)
		}
		data.ExtraRuntimes[name] = runtime{RuntimeType: "io.containerd.runc.v2", BinaryName: binary}
	}
	t := template.New("compiled_template")
	if _, err := t.New("base").Parse(string(base)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if _, err := t.Parse(string(text)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := t.Execute(os.Stdout, data); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
