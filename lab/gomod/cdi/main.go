// gpuk8s-cdi-check: the reference CDI library (tags.cncf.io/container-device-interface) as a
// small command, so tests can check gpuk8s' CDI specs and edits against it.
//
//	gpuk8s-cdi-check validate FILE...        read each spec as a runtime does (strict parse
//	                                          and the library's validation); exit 1 on any error
//	gpuk8s-cdi-check inject DIR DEVICE...     apply the named devices of the specs in DIR to
//	                                          the OCI runtime spec on stdin; print the result
//
// The library's own cmd/cdi is a nested module that is not published on the module proxy,
// hence this wrapper (lab/tools.sh cdi builds it).
package main

import (
	"encoding/json"
	"fmt"
	"os"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) < 3 {
		fail("usage: gpuk8s-cdi-check validate FILE... | inject DIR DEVICE...")
	}
	switch os.Args[1] {
	case "validate":
		bad := false
		for _, path := range os.Args[2:] {
			if _, err := cdi.ReadSpec(path, 0); err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
				bad = true
				continue
			}
			fmt.Printf("%s: valid\n", path)
		}
		if bad {
			os.Exit(1)
		}
	case "inject":
		cache, err := cdi.NewCache(cdi.WithSpecDirs(os.Args[2]), cdi.WithAutoRefresh(false))
		if err != nil {
			fail("%v", err)
		}
		for path, errs := range cache.GetErrors() {
			fail("%s: %v", path, errs)
		}
		var spec oci.Spec
		if err := json.NewDecoder(os.Stdin).Decode(&spec); err != nil {
			fail("reading the OCI spec from stdin: %v", err)
		}
		if _, err := cache.InjectDevices(&spec, os.Args[3:]...); err != nil {
			fail("%v", err)
		}
		if err := json.NewEncoder(os.Stdout).Encode(&spec); err != nil {
			fail("%v", err)
		}
	default:
		fail("unknown command %q: validate or inject", os.Args[1])
	}
}
