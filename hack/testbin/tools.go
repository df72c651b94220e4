//go:build tools

// Package tools pins the main packages that hack/build-testbin compiles into
// the end-to-end test binaries (kube-apiserver, kubectl, etcd). It is never
// built itself; it only keeps go.mod and go.sum complete.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
