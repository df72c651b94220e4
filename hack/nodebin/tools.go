//go:build tools

// Package tools pins the main packages that hack/build-nodebin compiles for the
// loopback node (kubelet, kube-scheduler). It is never built itself; it only
// keeps go.mod and go.sum complete.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
