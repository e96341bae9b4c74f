//go:build tools

// Package tools pins the etcd commands the lab builds (see lab/README.md for why not Debian's etcd 3.4).
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
