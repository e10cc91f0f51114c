package main

import (
	"log/slog"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/console"
)

// operatorAuth is who may sign in to the operator surface: see console.Auth.
type operatorAuth = console.Auth

// operatorAuthFromEnv reads the operators' credentials (console.LoadAuth), with one guard of
// failed sign-ins for every surface, logging to logger; a mistake in them is a usage error:
// serve exits 2 before it touches the database.
func operatorAuthFromEnv(logger *slog.Logger) (*operatorAuth, error) {
	a, err := console.LoadAuth(logger)
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
