package main

import (
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/console/surface"
)

// operatorAuth is who may sign in to the operator surface: see surface.Auth.
type operatorAuth = surface.Auth

// operatorAuthFromEnv reads the operators' credentials (surface.LoadAuth); a mistake in them
// is a usage error: serve exits 2 before it touches the database.
func operatorAuthFromEnv() (*operatorAuth, error) {
	a, err := surface.LoadAuth()
	if err != nil {
		return nil, cmdline.UsageError("%v", err)
	}
	return a, nil
}

// consoleSecurity is how serve mounts the console: its operators, the Host names it answers
// to besides loopback, and its in-flight cap (0: the console's default).
type consoleSecurity struct {
	auth        *operatorAuth
	hosts       []string
	maxInFlight int
}
