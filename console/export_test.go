package console

import "time"

// SetClock sets the clock of h's CSRF tokens, before h serves.
func SetClock(h *Handler, now func() time.Time) { h.now = now }

// GuardFreeFailures is the Guard's free failures per peer, for the external tests.
const GuardFreeFailures = guardFreeFailures

// Names is Users.names, for the external tests.
func (u *Users) Names() []string { return u.names() }

// LoadUsers is loadUsers, for the external tests.
var LoadUsers = loadUsers
