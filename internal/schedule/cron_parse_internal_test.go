package schedule

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"
)

// robfigFieldBits parses text as field i of a spec whose other fields are
// '*', with robfig's own parser.
func robfigFieldBits(i int, text string) (uint64, error) {
	fields := []string{"*", "*", "*", "*", "*"}
	fields[i] = text
	sched, err := robfigParse(strings.Join(fields, " "))
	if err != nil {
		return 0, err
	}
	spec := sched.(*cron.SpecSchedule)
	return [...]uint64{spec.Minute, spec.Hour, spec.Dom, spec.Month, spec.Dow}[i] &^ starBit, nil
}

// FuzzCheckField holds checkField, which only words the error messages, to
// robfig's grammar: it must reject exactly the fields robfig rejects (plus
// the empty set, which robfig accepts and ParseSpec refuses).
func FuzzCheckField(f *testing.F) {
	for _, seed := range []string{
		"*", "?", "*/5", "5", "1-5", "1-5/2", "5/10", "jan-mar", "MON-fri", "1,2,3", "*-5", "+5", "07",
		"61", "-5", "5-", "1-2-3", "1/2/3", "*/0", "*/-1", "5-1", ",", ",,1", "99999999999999999999", "sun-sat", "x",
	} {
		for i := range fieldDefs {
			f.Add(uint8(i), seed)
		}
	}
	f.Fuzz(func(t *testing.T, idx uint8, text string) {
		if text == "" || strings.ContainsFunc(text, func(r rune) bool { return strings.ContainsRune(" \t\n\v\f\r\u0085\u00a0", r) || r > 0x7f }) {
			return // the field splitter would make it a different spec
		}
		i := int(idx) % len(fieldDefs)
		bits, robfigErr := robfigFieldBits(i, text)
		ourErr := checkField(text, fieldDefs[i])
		if robfigErr == nil && bits != 0 {
			require.NoError(t, ourErr, "field %s %q: robfig accepts it", fieldDefs[i].name, text)
		} else {
			require.Error(t, ourErr, "field %s %q: robfig rejects it (%v) or it selects nothing", fieldDefs[i].name, text, robfigErr)
		}
	})
}

// FuzzParse feeds ParseSpec arbitrary text: it must never panic, every error
// must be a *SpecError naming the spec, and a rejected five-field spec must
// name its field.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"0 9 * * *", "@daily", "@every 1h", "CRON_TZ=Asia/Tokyo 0 9 * * *", "TZ=", "CRON_TZ=UTC",
		"TZ=UTC TZ=UTC", "61 * * * *", "0 0 30 2 *", "* * * * * *", "@", "", "0 , * * *",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		s, err := ParseSpec(spec, time.UTC, GapRunAfter)
		if err == nil {
			require.NotNil(t, s.Location())
			require.NotZero(t, s.cal.minute)
			require.NotZero(t, s.cal.hour)
			// A parsed spec always fires within about eight years.
			from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			slots, _ := s.Slots(from, from.AddDate(9, 0, 0), 1)
			require.Len(t, slots, 1, "spec %q never fires", spec)
			return
		}
		var specErr *SpecError
		require.True(t, errors.As(err, &specErr), "%T: %v", err, err)
		require.Equal(t, spec, specErr.Spec)
		require.True(t, strings.HasPrefix(err.Error(), "cron spec "), err.Error())
		require.NotContains(t, err.Error(), "robfig/cron panicked")

		words := strings.Fields(spec)
		if len(words) == 5 && !strings.HasPrefix(words[0], "@") && !strings.Contains(words[0], "=") {
			require.NotEmpty(t, specErr.Field, "five-field spec %q rejected without naming a field: %v", spec, err)
		}
	})
}
