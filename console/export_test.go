package console

import (
	"net/http"
	"time"
)

// SetClock sets the clock of the CSRF tokens of h, a console made by New, before h serves.
func SetClock(h http.Handler, now func() time.Time) { h.(*handler).now = now }

// GuardFreeFailures is the Guard's free failures per peer, for the external tests.
const GuardFreeFailures = guardFreeFailures

// Names is users.names, for the external tests.
func (u *users) Names() []string { return u.names() }

// ParseUsersList is parseUsers, for the external tests.
var ParseUsersList = parseUsers

// LoadUsers is loadUsers, for the external tests.
var LoadUsers = loadUsers
