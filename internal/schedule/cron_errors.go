package schedule

import (
	"errors"
	"fmt"
)

// ErrInvalidSpec is matched (errors.Is) by every error ParseSpec returns for a
// spec it cannot accept, including one whose CRON_TZ= prefix names an unknown
// zone.
var ErrInvalidSpec = errors.New("invalid cron spec")

// ErrUnknownZone is matched (errors.Is) by every error LoadZone returns, and
// by ParseSpec errors caused by a bad CRON_TZ= or TZ= prefix.
var ErrUnknownZone = errors.New("unknown time zone")

// SpecError is the error ParseSpec returns. Its message names the spec, the field
// at fault when there is one, and what to write instead:
//
//	cron spec "61 * * * *": minute field: value 61 out of range 0-59
type SpecError struct {
	// Spec is the spec as passed to ParseSpec.
	Spec string

	// Field names the field at fault: "minute", "hour", "day-of-month",
	// "month" or "day-of-week". Empty when the problem is not in one field
	// (field count, descriptor, time zone).
	Field string

	// Err says what is wrong and how to fix it.
	Err error
}

// Error implements error.
func (e *SpecError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("cron spec %q: %s field: %v", e.Spec, e.Field, e.Err)
	}
	return fmt.Sprintf("cron spec %q: %v", e.Spec, e.Err)
}

// Unwrap returns the underlying cause, so a *ZoneError inside stays visible
// to errors.As and errors.Is.
func (e *SpecError) Unwrap() error { return e.Err }

// Is reports whether target is ErrInvalidSpec.
func (e *SpecError) Is(target error) bool { return target == ErrInvalidSpec }

// ZoneError is the error LoadZone returns for a name that is not a usable
// IANA time zone.
type ZoneError struct {
	// Name is the zone name as given.
	Name string

	// Suggestion is a loadable name that differs from Name only in letter
	// case, or empty.
	Suggestion string

	// Err is the error from time.LoadLocation, or nil when the name was
	// refused before loading (empty name, "Local").
	Err error
}

// Error implements error.
func (e *ZoneError) Error() string {
	switch {
	case e.Name == "":
		return `empty time zone name: use an IANA name such as "America/New_York", or "UTC"`
	case e.Name == "Local":
		return `time zone "Local" is each host's own zone and differs between nodes: use an IANA name such as "America/New_York"`
	case e.Suggestion != "":
		return fmt.Sprintf("unknown time zone %q: did you mean %q?", e.Name, e.Suggestion)
	default:
		return fmt.Sprintf(`unknown time zone %q: use an IANA name such as "Europe/Berlin"; if the name is right, this host has no tz database (import _ "time/tzdata")`, e.Name)
	}
}

// Unwrap returns the error from time.LoadLocation, if any.
func (e *ZoneError) Unwrap() error { return e.Err }

// Is reports whether target is ErrUnknownZone.
func (e *ZoneError) Is(target error) bool { return target == ErrUnknownZone }
