// Command crio-merge loads a CRI-O configuration the way CRI-O 1.36 does, as a test double of CRI-O's own
// config loading (pkg/config: UpdateFromFile, then UpdateFromPath): the main file (when it exists), then every
// file under the drop-in directory in filepath.Walk's lexical order, whatever its name ends in, each decoded
// with github.com/BurntSushi/toml (the library CRI-O uses) over what the files before it set. A runtime table
// in a later file replaces that runtime's whole entry; other runtimes stay. Then CRI-O's check of the default
// runtime: a default_runtime without its [crio.runtime.runtimes.<name>] table stops CRI-O.
//
// Usage: crio-merge MAIN_FILE DROP_IN_DIR; prints the runtime part of the result as JSON.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/BurntSushi/toml"
)

type runtimeConfig struct {
	DefaultRuntime string                    `toml:"default_runtime" json:"default_runtime"`
	CDISpecDirs    []string                  `toml:"cdi_spec_dirs" json:"cdi_spec_dirs,omitempty"`
	Runtimes       map[string]map[string]any `toml:"runtimes" json:"runtimes"`
}

type tomlConfig struct {
	Crio struct {
		Runtime runtimeConfig `toml:"runtime"`
	} `toml:"crio"`
}

func load(path string, into *tomlConfig) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if _, err := toml.Decode(string(data), into); err != nil {
		return fmt.Errorf("unable to decode configuration %v: %w", path, err)
	}
	return nil
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: crio-merge MAIN_FILE DROP_IN_DIR")
		os.Exit(2)
	}
	config := &tomlConfig{}
	config.Crio.Runtime.Runtimes = map[string]map[string]any{}
	var loaded []string
	if _, err := os.Stat(os.Args[1]); err == nil {
		if err := load(os.Args[1], config); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		loaded = append(loaded, os.Args[1])
	}
	if _, err := os.Stat(os.Args[2]); err == nil {
		err := filepath.Walk(os.Args[2], func(p string, info os.FileInfo, err error) error {
			if err != nil || info.IsDir() {
				return err
			}
			loaded = append(loaded, p)
			return load(p, config)
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	rt := config.Crio.Runtime
	if _, ok := rt.Runtimes[rt.DefaultRuntime]; !ok && rt.DefaultRuntime != "" {
		fmt.Fprintf(os.Stderr, "default_runtime set to %q, but no runtime entry table [crio.runtime.runtimes.%s] was found\n",
			rt.DefaultRuntime, rt.DefaultRuntime)
		os.Exit(1)
	}
	out, _ := json.Marshal(map[string]any{"runtime": rt, "files": loaded})
	fmt.Println(string(out))
}
