package console

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/workflow"
)

// errBadInput marks a request the client can fix: answered 400 with the message.
var errBadInput = errors.New("bad request")

func badInput(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadInput, fmt.Sprintf(format, args...))
}

// pageCursor is a keyset position: the sort key of the last row shown. Opaque to the
// browser, validated on the way back in.
type pageCursor struct {
	At  time.Time
	Key string // operation_id or run key
}

func (c pageCursor) encode() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.At.UnixNano(), 10) + "\x00" + c.Key))
}

func decodeCursor(s string) (*pageCursor, error) {
	if s == "" {
		return nil, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(s) > 600 {
		return nil, badInput("after=%.40q is not a page cursor of this console: use the Next link", s)
	}
	ns, key, ok := strings.Cut(string(raw), "\x00")
	n, err := strconv.ParseInt(ns, 10, 64)
	// A key with a NUL or another control character is no key of ours (PostgreSQL refuses
	// a NUL in text: a 500 and an ERROR log for what is the client's mistake).
	if !ok || err != nil || key == "" || !utf8.ValidString(key) || strings.IndexFunc(key, unicode.IsControl) >= 0 {
		return nil, badInput("after=%.40q is not a page cursor of this console: use the Next link", s)
	}
	return &pageCursor{At: time.Unix(0, n), Key: key}, nil
}

var kindRE = regexp.MustCompile(`^[a-z0-9]+([_-][a-z0-9]+)*$`)

// opFilter is the operations list's filter, validated.
type opFilter struct {
	Kind, State, Run, BusinessKey string
	After                         *pageCursor
}

func (f opFilter) query() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"kind": f.Kind, "state": f.State, "run": f.Run, "business_key": f.BusinessKey} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return q
}

func parseOpFilter(q url.Values) (*opFilter, error) {
	if err := onlyParams(q, "kind", "state", "run", "business_key", "after"); err != nil {
		return nil, err
	}
	f := &opFilter{Kind: q.Get("kind"), State: q.Get("state"), Run: q.Get("run"), BusinessKey: q.Get("business_key")}
	if f.Kind != "" && (len(f.Kind) > outbox.MaxKindLen || !kindRE.MatchString(f.Kind)) {
		return nil, badInput("kind=%.60q: a kind is lower-case letters and digits joined by '_' or '-', at most %d characters, such as payout", f.Kind, outbox.MaxKindLen)
	}
	if f.State != "" && !validState(f.State) {
		return nil, badInput("state=%.60q: want one of %s", f.State, statesList())
	}
	if err := textParam("run", f.Run, 255); err != nil {
		return nil, err
	}
	if err := textParam("business_key", f.BusinessKey, outbox.MaxBusinessKeyLen); err != nil {
		return nil, err
	}
	var err error
	if f.After, err = decodeCursor(q.Get("after")); err != nil {
		return nil, err
	}
	if f.After != nil {
		if _, err := uuid.Parse(f.After.Key); err != nil {
			return nil, badInput("after: not a cursor of the operations list: use the Next link")
		}
	}
	return f, nil
}

// runFilter is the runs list's filter, validated.
type runFilter struct {
	Status, Workflow, Schedule string
	// Wait selects the runs waiting: for a kind of wait, or "manual" (waitFilters).
	Wait  string
	After *pageCursor
}

func (f runFilter) query() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"status": f.Status, "workflow": f.Workflow, "schedule": f.Schedule, "wait": f.Wait} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return q
}

var runStatuses = []string{string(workflow.RunStatusPending), string(workflow.RunStatusRunning), string(workflow.RunStatusSucceeded), string(workflow.RunStatusFailed), string(workflow.RunStatusCancelled)}

func parseRunFilter(q url.Values) (*runFilter, error) {
	if err := onlyParams(q, "status", "workflow", "schedule", "wait", "after"); err != nil {
		return nil, err
	}
	f := &runFilter{Status: q.Get("status"), Workflow: q.Get("workflow"), Schedule: q.Get("schedule"), Wait: q.Get("wait")}
	if f.Status != "" && !contains(runStatuses, f.Status) {
		return nil, badInput("status=%.60q: want one of %s", f.Status, strings.Join(runStatuses, ", "))
	}
	if f.Wait != "" && !contains(waitFilters, f.Wait) {
		return nil, badInput("wait=%.60q: want one of %s", f.Wait, strings.Join(waitFilters, ", "))
	}
	if err := textParam("workflow", f.Workflow, 255); err != nil {
		return nil, err
	}
	if err := textParam("schedule", f.Schedule, 128); err != nil {
		return nil, err
	}
	var err error
	if f.After, err = decodeCursor(q.Get("after")); err != nil {
		return nil, err
	}
	return f, nil
}

// onlyParams refuses parameters the page does not know: a typo ("stat=MANUAL") would
// otherwise silently show everything, and an operator would act on the wrong list.
func onlyParams(q url.Values, known ...string) error {
	for k, vs := range q {
		if !contains(known, k) {
			return badInput("unknown parameter %.40q: this page takes %s", k, strings.Join(known, ", "))
		}
		if len(vs) > 1 {
			return badInput("parameter %q given %d times: give it once", k, len(vs))
		}
	}
	return nil
}

// beforeParam reads an event page's keyset cursor: the id below which to list (all events when
// absent).
func beforeParam(q url.Values) (int64, error) {
	b := q.Get("before")
	if b == "" {
		return 1<<63 - 1, nil
	}
	n, err := strconv.ParseInt(b, 10, 64)
	if err != nil || n < 1 {
		return 0, badInput("before=%.40q: want an event id, as in the Older link", b)
	}
	return n, nil
}

func textParam(name, v string, max int) error {
	switch {
	case len(v) > max:
		return badInput("%s: %d bytes, at most %d", name, len(v), max)
	case !utf8.ValidString(v):
		return badInput("%s: not valid UTF-8", name)
	case strings.IndexFunc(v, unicode.IsControl) >= 0:
		return badInput("%s: holds control characters", name)
	}
	return nil
}

func validState(s string) bool {
	for _, st := range outbox.States() {
		if string(st) == s {
			return true
		}
	}
	return false
}

func statesList() string {
	var s []string
	for _, st := range outbox.States() {
		s = append(s, string(st))
	}
	return strings.Join(s, ", ")
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
