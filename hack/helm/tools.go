//go:build tools

// Package tools pins the main package that hack/build-helm compiles (the helm
// command line). It is never built itself; it only keeps go.mod and go.sum
// complete.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
