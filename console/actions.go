package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/internal/audittext"
	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/stepwisetype"
	"github.com/stepwise-go/stepwise/workflow"
)

// ActionEvent is the stepwise_event kind of every console action.
const ActionEvent = "console.action"

// reason reads and checks an action's reason: required (the audit trail says why), one
// line, bounded, and read as it was typed: no control characters, no invisible or
// bidirectional formatting characters (a U+202E shows "refund 100" as "001 dnufer").
//
// The actor, the signed-in user's name, goes into the same audit rows: it is held to the same
// rule here, so a name with a bidi control is refused clearly rather than by the SDK deeper
// down.
func (h *handler) reason(w http.ResponseWriter, r *http.Request, v *viewer) (string, bool) {
	if err := audittext.Check("the signed-in user's name", v.Actor); err != nil {
		h.fail(w, r, http.StatusForbidden, "%v; it cannot name an actor in the audit trail: fix the user's name", err)
		return "", false
	}
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	switch {
	case reason == "":
		h.fail(w, r, http.StatusBadRequest, "reason is required: the audit trail says why (a ticket, what the bank said)")
		return "", false
	case utf8.RuneCountInString(reason) > maxReason || !utf8.ValidString(reason):
		h.fail(w, r, http.StatusBadRequest, "reason: at most %d characters of valid UTF-8", maxReason)
		return "", false
	}
	if err := audittext.Check("reason", reason); err != nil {
		h.fail(w, r, http.StatusBadRequest, "%v", err)
		return "", false
	}
	return reason, true
}

// seenVersion reads the version of what the operator saw, which every action form of this
// console carries: a form without it was rendered by an older console (reload the page).
func (h *handler) seenVersion(w http.ResponseWriter, r *http.Request) (int64, bool) {
	s := r.PostForm.Get("seen_version")
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 1 {
		h.fail(w, r, http.StatusBadRequest, "seen_version=%.40q: the form sends the version of what you saw; reload the page and decide again", s)
		return 0, false
	}
	return v, true
}

// audit records a console action in tx: who, what, on which subject, why, from where.
func audit(ctx context.Context, tx pgx.Tx, subject, action, from, to, actor, reason string, r *http.Request) error {
	_, err := tx.Exec(ctx, `INSERT INTO stepwise_event (subject, kind, from_state, to_state, actor, detail)
		VALUES ($1, $2, nullif($3, ''), nullif($4, ''), $5, jsonb_build_object('action', $6::text, 'reason', $7::text, 'peer', $8::text))`,
		subject, ActionEvent, from, to, actor, action, reason, r.RemoteAddr)
	return err
}

func (h *handler) redirect(w http.ResponseWriter, r *http.Request, page string, q url.Values) {
	// 303: the browser GETs the page, so a reload does not re-post the action.
	http.Redirect(w, r, h.cfg.Prefix+page+"?"+q.Encode(), http.StatusSeeOther)
}

// cancelRun requests cancellation of a run, only if it is still in the status the operator
// saw: a run that finished meanwhile is not "cancelled" in the audit trail.
func (h *handler) cancelRun(w http.ResponseWriter, r *http.Request, v *viewer) {
	if h.cfg.Client == nil {
		h.fail(w, r, http.StatusNotFound, "cancel is not available here: Config.Client is not set")
		return
	}
	key, seen := r.PostForm.Get("key"), r.PostForm.Get("seen")
	if key == "" || textParam("key", key, 255) != nil {
		h.fail(w, r, http.StatusBadRequest, "key: the run's key is required")
		return
	}
	if seen != string(workflow.RunStatusPending) && seen != string(workflow.RunStatusRunning) {
		h.fail(w, r, http.StatusBadRequest, "seen=%.40q: only a pending or running run can be cancelled; the form sends the status you saw", seen)
		return
	}
	// The version the operator saw, sent by this console's cancel form (a form of an older
	// console sends the status only, which is still checked).
	var version int64
	if r.PostForm.Has("seen_version") {
		var ok bool
		if version, ok = h.seenVersion(w, r); !ok {
			return
		}
	}
	reason, ok := h.reason(w, r, v)
	if !ok {
		return
	}
	ctx := r.Context()
	status := ""
	err := pgx.BeginFunc(ctx, h.db, func(tx pgx.Tx) error {
		// Lock the run row: a worker finishing the run between the check and the request
		// would otherwise turn "cancel what I saw running" into a cancel of a finished run.
		if err := tx.QueryRow(ctx, `SELECT status FROM stepwise_run WHERE key = $1 FOR UPDATE`, key).Scan(&status); err != nil {
			return err
		}
		if status != seen {
			return errMoved
		}
		// The client checks the version seen under the same lock, and records the request.
		if _, err := h.cfg.Client.RunCancelTx(ctx, tx, key, &stepwise.RunCancelOpts{Actor: v.Actor, Reason: reason, ExpectedVersion: version}); err != nil {
			return err
		}
		return audit(ctx, tx, key, "run.cancel", status, "cancel_requested", v.Actor, reason, r)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		h.fail(w, r, http.StatusNotFound, "no run with key %q", key)
		return
	case errors.Is(err, errMoved):
		h.fail(w, r, http.StatusConflict, "run %q is %s now, not %s as you saw it: nothing was done; reload the run and decide again", key, status, seen)
		return
	case errors.Is(err, stepwisetype.ErrChanged), errors.Is(err, stepwise.ErrRunNotCancellable):
		h.fail(w, r, http.StatusConflict, "run %q was not cancelled: %s; nothing was done: reload the run and decide again", key, h.runNow(ctx, key, seen, version))
		return
	case err != nil:
		h.internal(w, r, "cancelling the run", err)
		return
	}
	h.logger.Info("console: run cancel requested", "run", key, "actor", v.Actor, "reason", reason)
	h.redirect(w, r, "/run", url.Values{"key": {key}})
}

var errMoved = errors.New("moved since seen")

// resumeRun resumes a run through the client (Config.Client), with the version of the run the
// operator saw, and audits it.
func (h *handler) resumeRun(w http.ResponseWriter, r *http.Request, v *viewer) {
	if !h.canResume() {
		h.fail(w, r, http.StatusNotFound, "resume is not available here: Config.Client is not set")
		return
	}
	key, seen := r.PostForm.Get("key"), r.PostForm.Get("seen")
	if key == "" || textParam("key", key, 255) != nil {
		h.fail(w, r, http.StatusBadRequest, "key: the run's key is required")
		return
	}
	if seen != string(workflow.RunStatusFailed) && seen != string(workflow.RunStatusCancelled) {
		h.fail(w, r, http.StatusBadRequest, "seen=%.40q: only a failed or cancelled run can be resumed; the form sends the status you saw", seen)
		return
	}
	version, ok := h.seenVersion(w, r)
	if !ok {
		return
	}
	reason, ok := h.reason(w, r, v)
	if !ok {
		return
	}
	ctx := r.Context()
	left, err := h.resume(ctx, key, seen, version, v.Actor, reason, r)
	if err != nil {
		switch {
		case errors.Is(err, stepwisetype.ErrNotFound):
			h.logger.Warn("console: resume refused", "run", key, "actor", v.Actor, "error", err)
			h.fail(w, r, http.StatusNotFound, "no run with key %q: nothing was done", key)
		case errors.Is(err, stepwisetype.ErrChanged), errors.Is(err, workflow.ErrRunNotResumable):
			// Guards against a resume decided on a stale page (the run was resumed, ran and
			// failed again since): the operator gets what it is now, from the database.
			h.logger.Warn("console: resume refused", "run", key, "actor", v.Actor, "error", err)
			h.fail(w, r, http.StatusConflict, "run %q was not resumed: %s; nothing was done: reload the run, read what changed and decide again",
				key, h.runNow(ctx, key, seen, version))
		default:
			// Anything else is the database's failure; its text may name users, databases
			// and hosts: logged under a reference, not shown.
			h.internal(w, r, "resuming the run", err)
		}
		return
	}
	h.logger.Info("console: run resumed", "run", key, "actor", v.Actor, "reason", reason, "seen_version", version, "left_as_they_are", left)
	h.redirect(w, r, "/run", url.Values{"key": {key}})
}

// resume resumes the run and writes the console's audit row, in one transaction, and
// returns the descendants it left as they are (the run page's events list them too).
func (h *handler) resume(ctx context.Context, key, seen string, version int64, actor, reason string, r *http.Request) (left []string, err error) {
	err = pgx.BeginFunc(ctx, h.db, func(tx pgx.Tx) error {
		res, err := h.cfg.Client.RunResumeTx(ctx, tx, key, &stepwise.RunResumeOpts{Actor: actor, Reason: reason, ExpectedVersion: version})
		if err != nil {
			return err
		}
		left = res.LeftAsTheyAre
		return audit(ctx, tx, key, "run.resume", seen, "resumed", actor, reason, r)
	})
	return left, err
}

func (h *handler) canResume() bool { return h.cfg.Client != nil }
func (h *handler) canResolve() bool {
	return h.cfg.Client != nil && len(h.cfg.Client.OperationKinds()) > 0
}

// canResolveKind reports whether the console offers Resolve on operations of kind: with the
// client, only the kinds whose callbacks it runs (a button that is always refused is not an
// action).
func (h *handler) canResolveKind(kind string) bool {
	return h.cfg.Client != nil && slices.Contains(h.cfg.Client.OperationKinds(), kind)
}

// requests lists an operation's requests through the client.
func (h *handler) requests(ctx context.Context, id uuid.UUID) ([]request, error) {
	rs, err := h.cfg.Client.OperationRequestList(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make([]request, 0, len(rs))
	for _, rq := range rs {
		cr := request{Attempt: rq.Claim, EndedAt: rq.EndedAt, Outcome: string(rq.Outcome), Detail: rq.Error}
		if rq.StartedAt != nil {
			cr.StartedAt = *rq.StartedAt
		} else {
			cr.Detail = "claimed by " + rq.Actor + "; its dispatcher died holding the claim: the request may or may not have begun"
		}
		out = append(out, cr)
	}
	return out, nil
}

// runNow describes a run as it is now against what the operator saw, for a refusal.
func (h *handler) runNow(ctx context.Context, key, seen string, seenVersion int64) string {
	var status string
	var version int64
	var lastError *string
	err := h.db.QueryRow(ctx, `SELECT status, version, last_error FROM stepwise_run WHERE key = $1`, key).Scan(&status, &version, &lastError)
	if err != nil {
		return fmt.Sprintf("it is no longer %s (version %d) as you saw it", seen, seenVersion)
	}
	msg := fmt.Sprintf("you saw it %s at version %d; it is %s now, at version %d", seen, seenVersion, status, version)
	if version > seenVersion && status == seen {
		msg += fmt.Sprintf(" (it changed status %d times since, and came back to %s)", version-seenVersion, status)
	}
	if lastError != nil && *lastError != "" {
		msg += fmt.Sprintf("; its last error: %q", *lastError)
	}
	return msg
}

// resolveOperation records a person's decision on a MANUAL operation through
// reconcile.ResolveTx, conditional on the state the operator saw, with the console's audit
// row in the same transaction.
func (h *handler) resolveOperation(w http.ResponseWriter, r *http.Request, v *viewer) {
	if !h.canResolve() {
		h.fail(w, r, http.StatusNotFound, "resolving is not available here: Config.Client is not set")
		return
	}
	id, err := uuid.Parse(r.PostForm.Get("id"))
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, "id: want the operation_id (a UUID)")
		return
	}
	seen := outbox.State(r.PostForm.Get("seen"))
	if seen != outbox.StateManual {
		h.fail(w, r, http.StatusBadRequest, "seen=%.40q: the console resolves MANUAL operations; the form sends the state you saw", seen)
		return
	}
	version, ok := h.seenVersion(w, r)
	if !ok {
		return
	}
	outcome := outbox.State(r.PostForm.Get("outcome"))
	if outcome != outbox.StateSucceeded && outcome != outbox.StateFailedPermanent && outcome != outbox.StateRetryable {
		h.fail(w, r, http.StatusBadRequest, "outcome=%.40q: want SUCCEEDED (it happened), FAILED_PERMANENT (it did not and will not) or RETRYABLE (send it again under the same id)", outcome)
		return
	}
	ref := strings.TrimSpace(r.PostForm.Get("external_ref"))
	if err := textParam("external_ref", ref, 255); err != nil {
		h.badRequest(w, r, err)
		return
	}
	reason, ok := h.reason(w, r, v)
	if !ok {
		return
	}
	ctx := r.Context()
	err = pgx.BeginFunc(ctx, h.db, func(tx pgx.Tx) error {
		// ResolveTx moves the operation only if it is still the one the operator saw: its
		// state and its version (another operator or the reconciler may have settled it
		// meanwhile, or sent it again and brought it back to MANUAL for another reason).
		// The client runs the kind's outcome callback through its outbox, in tx.
		if _, err := h.cfg.Client.OperationResolveTx(ctx, tx, id, &stepwise.OperationResolveOpts{
			Outcome: outcome, ExpectedState: seen, ExpectedVersion: version, Actor: v.Actor, Reason: reason, ExternalRef: ref,
		}); err != nil {
			return err
		}
		return audit(ctx, tx, "op:"+id.String(), "operation.resolve", string(seen), string(outcome), v.Actor, reason, r)
	})
	// The ledger's own sentinels, not the shared ErrNotFound/ErrChanged: the kind's outcome
	// callback runs in tx, and a run or row it does not find, or a run that changed, is its
	// failure (a 500), not "no such operation".
	switch {
	case errors.Is(err, outbox.ErrNotFound):
		h.fail(w, r, http.StatusNotFound, "no operation %s", id)
		return
	case errors.Is(err, outbox.ErrStateChanged):
		h.fail(w, r, http.StatusConflict, "operation %s is no longer the %s you saw: nothing was done; %s; reload it, read what changed and decide again",
			id, seen, h.operationNow(ctx, id, seen, version))
		return
	case errors.Is(err, reconcile.ErrInvalidResolution), errors.Is(err, outbox.ErrInvalidTransition):
		h.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	case errors.Is(err, outbox.ErrUnknownKind):
		// The console's client has no config for the kind: its callback cannot run here.
		h.fail(w, r, http.StatusConflict, "operation %s was not resolved: %v", id, err)
		return
	case err != nil:
		h.internal(w, r, "resolving the operation", err)
		return
	}
	h.logger.Info("console: operation resolved", "operation", id, "outcome", outcome, "actor", v.Actor, "reason", reason, "seen_version", version)
	h.redirect(w, r, "/operation", url.Values{"id": {id.String()}})
}

// operationNow describes an operation as it is now against what the operator saw, with the
// evidence a new decision needs, for a refusal.
func (h *handler) operationNow(ctx context.Context, id uuid.UUID, seen outbox.State, seenVersion int64) string {
	op, err := outbox.Get(ctx, h.db, id)
	if err != nil {
		return fmt.Sprintf("it is no longer %s at version %d", seen, seenVersion)
	}
	msg := fmt.Sprintf("you saw it %s at version %d; it is %s now, at version %d", seen, seenVersion, op.State, op.Version)
	if op.Version > seenVersion && op.State == seen {
		msg += fmt.Sprintf(" (it changed state %d times since, and came back to %s)", op.Version-seenVersion, op.State)
	}
	for _, f := range []struct{ name, v string }{
		{"why MANUAL", op.ManualReason}, {"last lookup", op.LastLookup}, {"last error", op.LastError}, {"external reference", op.ExternalRef},
	} {
		if f.v != "" {
			msg += fmt.Sprintf("; %s: %q", f.name, f.v)
		}
	}
	return msg
}
