package schedule

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// robfigParser is robfig/cron's standard parser (cron.ParseStandard):
// minute, hour, day of month, month, day of week, and descriptors. The
// grammar and the field sets are robfig's; what this package adds is the
// time-zone handling, the error messages and the slot arithmetic.
var robfigParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// starBit is the bit robfig/cron sets in a field when it contains '*' or '?'.
const starBit = 1 << 63

// descriptors maps each descriptor robfig/cron accepts (besides @every) to
// the fields it stands for. The fields decide FixedTime; the sets still come
// from robfig's parser.
var descriptors = map[string]string{
	"@yearly":   "0 0 1 1 *",
	"@annually": "0 0 1 1 *",
	"@monthly":  "0 0 1 * *",
	"@weekly":   "0 0 * * 0",
	"@daily":    "0 0 * * *",
	"@midnight": "0 0 * * *",
	"@hourly":   "0 * * * *",
}

// field describes one of the five fields, for messages and checks.
type field struct {
	name     string
	min, max uint
	names    map[string]uint
	example  string // a name, for messages
	hint     string // appended to out-of-range messages
}

var fieldDefs = [5]field{
	{name: "minute", min: 0, max: 59},
	{name: "hour", min: 0, max: 23},
	{name: "day-of-month", min: 1, max: 31},
	{name: "month", min: 1, max: 12, example: "jan", names: map[string]uint{
		"jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6,
		"jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12,
	}},
	{name: "day-of-week", min: 0, max: 6, example: "mon", hint: " (Sunday is 0)", names: map[string]uint{
		"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6,
	}},
}

// parse turns spec into a Spec. See ParseSpec for the rules.
func parse(spec string, zone *time.Location, gap GapPolicy) (*Spec, error) {
	fail := func(fieldName string, err error) (*Spec, error) {
		return nil, &SpecError{Spec: spec, Field: fieldName, Err: err}
	}
	if gap != GapRunAfter && gap != GapSkip {
		return fail("", fmt.Errorf("unknown gap policy %d: use GapRunAfter or GapSkip", int(gap)))
	}

	words := strings.Fields(spec)
	if len(words) == 0 {
		return fail("", errors.New(`empty spec: want five fields "minute hour day-of-month month day-of-week", or a descriptor such as @daily`))
	}

	// A CRON_TZ= or TZ= prefix overrides the zone argument. It is stripped
	// here rather than by robfig/cron, whose v3.0.1 parser panics on a
	// prefix with nothing after it and falls back to time.Local.
	loc := zone
	if name, ok := zonePrefix(words[0]); ok {
		var err error
		if loc, err = LoadZone(name); err != nil {
			return fail("", err)
		}
		words = words[1:]
		if len(words) == 0 {
			return fail("", fmt.Errorf("nothing after %q: add the five fields, e.g. %q", spec, strings.TrimSpace(spec)+" 0 9 * * *"))
		}
		if _, again := zonePrefix(words[0]); again {
			return fail("", errors.New("more than one time zone prefix: keep one CRON_TZ="))
		}
	}
	switch {
	case loc == nil:
		return fail("", errors.New(`no time zone: pass one loaded with LoadZone, or prefix the spec with CRON_TZ=, e.g. "CRON_TZ=UTC 0 9 * * *"`))
	case loc == time.Local:
		return fail("", errors.New("time.Local is each host's own zone and differs between nodes: pass a zone loaded with LoadZone"))
	}

	var text string // the five fields, descriptors expanded
	if strings.HasPrefix(words[0], "@") {
		switch {
		case words[0] == "@every":
			return fail("", everyError(strings.Join(words[1:], " ")))
		case len(words) > 1:
			return fail("", fmt.Errorf("descriptor %s takes no fields: drop %q", words[0], strings.Join(words[1:], " ")))
		}
		var ok bool
		if text, ok = descriptors[words[0]]; !ok {
			return fail("", fmt.Errorf("unknown descriptor %s: use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly, or five fields", words[0]))
		}
	} else {
		if len(words) != 5 {
			msg := fmt.Sprintf("want five fields (minute hour day-of-month month day-of-week), found %d", len(words))
			if len(words) == 6 {
				msg += ": seconds are not supported"
			}
			return fail("", errors.New(msg))
		}
		text = strings.Join(words, " ")
	}

	parsed, err := robfigParse(strings.Join(words, " "))
	if err != nil {
		// robfig's messages do not say which field is wrong; checkField
		// follows the same grammar and does.
		fieldTexts := strings.Fields(text)
		for i, def := range fieldDefs {
			if ferr := checkField(fieldTexts[i], def); ferr != nil {
				return fail(def.name, ferr)
			}
		}
		return fail("", err)
	}
	sched, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return fail("", fmt.Errorf("robfig/cron returned %T, not a field schedule", parsed))
	}

	cal := calendar{
		minute:  sched.Minute &^ starBit,
		hour:    sched.Hour &^ starBit,
		dom:     sched.Dom &^ starBit,
		month:   sched.Month &^ starBit,
		dow:     sched.Dow &^ starBit,
		domStar: sched.Dom&starBit != 0,
		dowStar: sched.Dow&starBit != 0,
	}
	fieldTexts := strings.Fields(text)
	// robfig accepts a field of bare commas as the empty set: a schedule
	// that never fires, which must fail here, not stay silent forever.
	for i, set := range []uint64{cal.minute, cal.hour, cal.dom, cal.month, cal.dow} {
		if set == 0 {
			return fail(fieldDefs[i].name, fmt.Errorf("%q selects no values: name at least one", fieldTexts[i]))
		}
	}
	if !cal.someDayMatches() {
		return fail("day-of-month", errors.New("none of the selected days exists in the selected months, so the spec would never fire"))
	}

	return &Spec{
		text:  strings.TrimSpace(spec),
		loc:   loc,
		gap:   gap,
		fixed: !isWildcard(fieldTexts[0]) && !isWildcard(fieldTexts[1]),
		cal:   cal,
	}, nil
}

// robfigParse calls robfig/cron's parser. A panic in it must surface as a
// registration error, never take the process down.
func robfigParse(spec string) (sched cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("robfig/cron panicked: %v", r)
		}
	}()
	return robfigParser.Parse(spec)
}

// zonePrefix returns the zone name of a "CRON_TZ=name" or "TZ=name" word.
func zonePrefix(word string) (string, bool) {
	for _, p := range []string{"CRON_TZ=", "TZ="} {
		if name, ok := strings.CutPrefix(word, p); ok {
			return name, true
		}
	}
	return "", false
}

// isWildcard reports whether a minute or hour field is '*'-based: some
// comma-separated part starts with '*' or '?' ("*", "*/15", "?"). This is
// Vixie cron's rule (it checks the field's first character; a list such as
// "5,*" counts here too, since it selects every value anyway).
func isWildcard(text string) bool {
	for part := range strings.SplitSeq(text, ",") {
		if strings.HasPrefix(part, "*") || strings.HasPrefix(part, "?") {
			return true
		}
	}
	return false
}

// someDayMatches reports whether any real date matches the day fields.
// Only a day-of-month restricted together with a '*' day-of-week can fail
// ("0 0 30 2 *"): otherwise every month has the wanted weekdays.
func (c *calendar) someDayMatches() bool {
	if !c.dowStar || c.domStar {
		return true
	}
	daysIn := [13]uint{0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}
	for m := uint(1); m <= 12; m++ {
		if c.month&(1<<m) != 0 && c.dom&(1<<(daysIn[m]+1)-1) != 0 {
			return true
		}
	}
	return false
}

// everyError explains why @every is refused and, when the interval has an
// exact cron spelling, gives it.
func everyError(arg string) error {
	const why = "@every is not supported: slots must sit on the calendar and be the same on every node, while @every counts from whenever a process starts"
	if d, err := time.ParseDuration(arg); err == nil {
		if alt := everyAsFields(d); alt != "" {
			return fmt.Errorf("%s; use %q instead", why, alt)
		}
	}
	return fmt.Errorf(`%s; use five fields, e.g. "*/15 * * * *" or "0 */2 * * *"`, why)
}

// everyAsFields returns the five-field spec that fires every d, aligned to
// the clock, when there is one.
func everyAsFields(d time.Duration) string {
	switch {
	case d == time.Minute:
		return "* * * * *"
	case d == time.Hour:
		return "0 * * * *"
	case d == 24*time.Hour:
		return "0 0 * * *"
	case d > 0 && d < time.Hour && d%time.Minute == 0 && time.Hour%d == 0:
		return fmt.Sprintf("*/%d * * * *", d/time.Minute)
	case d > 0 && d < 24*time.Hour && d%time.Hour == 0 && (24*time.Hour)%d == 0:
		return fmt.Sprintf("0 */%d * * *", d/time.Hour)
	}
	return ""
}

// checkField validates one field with robfig/cron's grammar (a comma list of
// "*", "?", "n", "n-m", each optionally "/step"; "n/step" means n to the
// maximum) and says what is wrong. It must accept exactly what robfig
// accepts; FuzzParse checks that.
func checkField(text string, def field) error {
	parts := strings.FieldsFunc(text, func(r rune) bool { return r == ',' })
	if len(parts) == 0 {
		return fmt.Errorf("%q selects no values: name at least one", text)
	}
	for _, part := range parts {
		if err := checkPart(part, def); err != nil {
			return err
		}
	}
	return nil
}

func checkPart(part string, def field) error {
	rangeAndStep := strings.Split(part, "/")
	if len(rangeAndStep) > 2 {
		return fmt.Errorf(`%q has more than one "/"`, part)
	}
	lowHigh := strings.Split(rangeAndStep[0], "-")

	var start, end uint
	if lowHigh[0] == "*" || lowHigh[0] == "?" {
		// robfig ignores anything after "*-"; so do we, to accept the same.
		start, end = def.min, def.max
	} else {
		var err error
		if start, err = fieldValue(lowHigh[0], part, def); err != nil {
			return err
		}
		switch len(lowHigh) {
		case 1:
			end = start
		case 2:
			if end, err = fieldValue(lowHigh[1], part, def); err != nil {
				return err
			}
		default:
			return fmt.Errorf(`%q has more than one "-"`, part)
		}
	}

	step := uint(1)
	if len(rangeAndStep) == 2 {
		n, err := strconv.Atoi(rangeAndStep[1])
		if err != nil || n < 0 {
			return fmt.Errorf("step %q in %q is not a whole number", rangeAndStep[1], part)
		}
		step = uint(n)
		if len(lowHigh) == 1 {
			end = def.max
		}
	}

	switch {
	case start < def.min:
		return fmt.Errorf("value %d out of range %d-%d%s", start, def.min, def.max, def.hint)
	case end > def.max:
		return fmt.Errorf("value %d out of range %d-%d%s", end, def.min, def.max, def.hint)
	case start > end:
		return fmt.Errorf(`range %q runs backwards: write a range that wraps as two, e.g. "%d-%d,%d-%d"`, part, start, def.max, def.min, end)
	case step == 0:
		return fmt.Errorf("step in %q must be at least 1", part)
	}
	return nil
}

// fieldValue parses a number, or a name such as "jan" or "mon" where the
// field has names.
func fieldValue(s, part string, def field) (uint, error) {
	if def.names != nil {
		if v, ok := def.names[strings.ToLower(s)]; ok {
			return v, nil
		}
	}
	n, err := strconv.Atoi(s)
	switch {
	case s == "":
		return 0, fmt.Errorf("%q is missing a number", part)
	case err != nil && def.names != nil:
		return 0, fmt.Errorf("%q is not a number or a name such as %q", s, def.example)
	case err != nil:
		return 0, fmt.Errorf("%q is not a number", s)
	case n < 0:
		return 0, fmt.Errorf("value %d out of range %d-%d%s", n, def.min, def.max, def.hint)
	}
	return uint(n), nil
}
