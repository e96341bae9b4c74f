//go:build tools

// Package tools pins the containerd 2.x commands the lab builds (lab/up --containerd 2; see
// lab/README.md): the daemon, its runc shim and the ctr client.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
