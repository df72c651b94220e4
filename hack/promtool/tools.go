//go:build tools

// Package tools pins the main package that hack/build-promtool compiles (promtool,
// Prometheus' rule checker). It is never built itself; it only keeps go.mod and
// go.sum complete.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
