//go:build tools

// Package tools pins the main package that hack/build-helm 3 compiles (the Helm 3
// command line). It is never built itself; it only keeps go.mod and go.sum
// complete.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
