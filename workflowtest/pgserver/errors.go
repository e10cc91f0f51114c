package pgserver

import (
	"errors"
	"fmt"
)

// ErrNoServer is returned by Find when no variable is set, nothing answers on
// 127.0.0.1:5432 and no PostgreSQL binaries are installed. Its message says how to install
// PostgreSQL or which variable to set.
var ErrNoServer = errors.New("no PostgreSQL server found")

// EnvServerError is returned by Find when a URL variable is set but its server does not
// answer. Find does not fall back to another server: the user asked for this one.
type EnvServerError struct {
	Var  string // name of the variable, e.g. TEST_DATABASE_URL
	Host string // host:port from its URL (the URL itself may hold a password)
	Err  error
}

func (e *EnvServerError) Error() string {
	return fmt.Sprintf("$%s points at %s, which does not answer (%v); start that server, fix the variable, or unset it to use a local or throwaway server",
		e.Var, e.Host, e.Err)
}

func (e *EnvServerError) Unwrap() error { return e.Err }
