//go:build tools

// Package tools pins kube-apiserver v1.37.2 for hack/build-testbin 1.37. It is never
// built itself; it only keeps go.mod and go.sum complete. etcd and kubectl come from
// hack/testbin: etcd 3.6.8 serves this release too.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
