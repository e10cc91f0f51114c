package outbox

import (
	"encoding/json"
	"fmt"
	"regexp"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/pgtx"
)

// MaxPayloadBytes is the largest EnqueueParams.Payload Enqueue accepts. The payload travels in
// every claim and is kept forever in the ledger; a larger document belongs in the caller's
// own table, with its key in the payload.
const MaxPayloadBytes = 64 << 10

// Limits on an operation's identifying fields.
const (
	MaxKindLen        = 48  // "stepwise_outbox_" + kind must fit River's 64-character queue names
	MaxBusinessKeyLen = 255 // fits an index entry comfortably
)

// maxErrorLen bounds Operation.LastError: an external system's error body can be large, and
// the ledger keeps the message, not the conversation.
const maxErrorLen = 1024

// State is where an operation is in its life. See the package documentation for the table of
// states and transitions.
type State string

const (
	// StatePending: committed with the business writes, not yet sent.
	StatePending State = "PENDING"
	// StateProcessing: a dispatcher holds a lease on it and may be calling out.
	StateProcessing State = "PROCESSING"
	// StateSucceeded: the external system confirmed it. Terminal.
	StateSucceeded State = "SUCCEEDED"
	// StateFailedPermanent: the external system definitely refused it. Terminal.
	StateFailedPermanent State = "FAILED_PERMANENT"
	// StateRetryable: definitely not executed; it is sent again later under the same id.
	StateRetryable State = "RETRYABLE"
	// StateUnknownExternal: it may or may not have happened; the reconciler finds out.
	StateUnknownExternal State = "UNKNOWN_EXTERNAL"
	// StateManual: a person must decide (see reconcile.Resolve).
	StateManual State = "MANUAL"
)

// States lists every state, in the order of the package documentation's table.
func States() []State {
	return []State{StatePending, StateProcessing, StateSucceeded, StateFailedPermanent,
		StateRetryable, StateUnknownExternal, StateManual}
}

// Terminal reports whether s is final: SUCCEEDED or FAILED_PERMANENT. MANUAL is not: it waits
// for a person.
func (s State) Terminal() bool { return s == StateSucceeded || s == StateFailedPermanent }

func (s State) valid() bool {
	for _, v := range States() {
		if s == v {
			return true
		}
	}
	return false
}

// transitions is the state machine. Every UPDATE of a state also names the state it expects
// (WHERE state = from), so two movers that disagree cannot both win.
var transitions = map[State][]State{
	StatePending:         {StateProcessing},
	StateRetryable:       {StateProcessing},
	StateProcessing:      {StateSucceeded, StateFailedPermanent, StateRetryable, StateUnknownExternal, StateManual},
	StateUnknownExternal: {StateSucceeded, StateFailedPermanent, StateRetryable, StateManual},
	StateManual:          {StateSucceeded, StateFailedPermanent, StateRetryable},
}

// CanTransition reports whether the state machine allows moving an operation from one state
// to another.
func CanTransition(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// namespace is the UUID v5 namespace of operation ids derived by OperationID. It is fixed
// forever: changing it would give every existing operation a new idempotency key, and an
// external system would apply a resent operation a second time.
var namespace = uuid.MustParse("6b1f0c9e-3d0a-5f43-9b52-7f8e0a7d2c11")

// OperationID derives the stable id of the operation of kind for businessKey (UUID v5). The
// same kind and key give the same id in every process and every release, which is what makes
// a step that runs twice enqueue the same operation twice, a no-op, rather than two payments.
func OperationID(kind, businessKey string) uuid.UUID {
	// The NUL separator keeps ("a", "b:c") and ("a:b", "c") apart.
	return uuid.NewSHA1(namespace, []byte(kind+"\x00"+businessKey))
}

// datedNamespace is the UUID v5 namespace of the hash part of DatedOperationID's ids, fixed
// forever for the same reason as namespace.
var datedNamespace = uuid.MustParse("2f6c1b8e-9a47-5d0e-8c3b-4e1d7a9f0b62")

// DatedOperationID derives the stable id of the operation of kind for businessKey that
// belongs to the business day date, for ledgers that will hold years. It is a UUID version 8:
// the first 48 bits are the Unix milliseconds of the date's midnight (UTC), as in a UUID v7,
// and the rest a hash of kind and businessKey, as in OperationID. What counts of date is its
// calendar day in UTC: pass the day's midnight UTC, as time.Parse(time.DateOnly, s) and a
// PostgreSQL date column give it. The instant decides, not the location it is shown in,
// because the location can differ between hosts (pgx reads a timestamptz in the host's local
// zone) and the id must not. Dates before 1970 count as 1970-01-01.
//
// Why it exists: OperationID's ids are uniformly random, and so are the positions of a new
// operation in every index keyed by its id (the ledger's primary key, its request rows, its
// audit events). On a ledger of millions of operations each new one then writes to an index
// page nobody wrote since the last checkpoint, and PostgreSQL logs that whole page: about 8 KB
// of WAL per index per operation. Ids of one date sort together, so a day's operations fill
// the end of each index (docs/design.md, *A long history*). Within a day they are random: a
// day of a million operations still spreads over a few thousand pages of each index, written
// once per checkpoint cycle rather than once per operation.
//
// The date is part of the identity, like the business key: a step that runs again must derive
// the same id, so pass a date the step reads from its input (a settlement date), never the
// clock. A kind moves from OperationID to DatedOperationID at a date no running build can have
// enqueued yet (from tomorrow's business date, say), never for dates already in progress: a
// step whose commit a failover lost would otherwise enqueue, under the new id, a payment the
// bank already has under the old one. An operation still in the ledger is safe either way:
// enqueueing its kind and business key under another id is ErrOperationConflict.
func DatedOperationID(date time.Time, kind, businessKey string) uuid.UUID {
	id := uuid.NewSHA1(datedNamespace, []byte(kind+"\x00"+businessKey))
	y, m, d := date.UTC().Date()
	ms := min(max(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).UnixMilli(), 0), 1<<48-1)
	for i := 5; i >= 0; i-- {
		id[i] = byte(ms)
		ms >>= 8
	}
	id[6] = 0x80 | id[6]&0x0f // version 8; NewSHA1 has set the variant bits already
	return id
}

// EnqueueParams is what a caller says about one external side effect when it enqueues it:
// Kind, BusinessKey and Payload, Amount and Currency for money, and optionally the ID and the
// RunKey (which Enqueue fills in).
type EnqueueParams struct {
	// ID is the operation_id and the idempotency key sent to the external system.
	// Defaults to OperationID(Kind, BusinessKey) when zero. For a ledger that will hold years,
	// set it to DatedOperationID(date, Kind, BusinessKey).
	ID uuid.UUID
	// Kind selects the Sender (and reconcile's Checker), e.g. "payout".
	Kind string
	// BusinessKey identifies the effect in the caller's terms, e.g. "settle/2026-03-01/m-42".
	// (Kind, BusinessKey) is unique.
	BusinessKey string
	// Payload is what the Sender needs to perform the operation, as JSON (at most
	// MaxPayloadBytes). Defaults to {}.
	Payload json.RawMessage
	// Amount in minor units (cents) and Currency (ISO 4217, e.g. "EUR"), for operations
	// that move money: the reconciler compares them with what the external system holds and
	// totals them against its statement. Optional.
	Amount   int64
	Currency string
	// RunKey is the key of the workflow run that enqueued the operation, so that a batch is
	// complete only when the operations of its runs are (see UnfinishedForRuns). Inside a
	// step Enqueue fills it in from the step's context, and refuses another run's key; set
	// it only when enqueueing for a run from outside its steps.
	RunKey string
}

// Operation is one external side effect in the ledger, as read back: the EnqueueParams it was
// enqueued with (so a Sender reads op.Kind, op.Payload, op.Amount) and what the ledger has
// recorded since (State, Attempts, ExternalRef, ...). Enqueue fills ID and RunKey when the
// caller left them empty.
type Operation struct {
	EnqueueParams

	State State
	// Attempts counts requests: Send calls begun, plus claims lost with a dispatcher that
	// died holding them (a request may have begun). Claims counts claims. Attempts below
	// Claims means some claims never reached the external system; the requests themselves
	// are in stepwise_operation_request (see Requests).
	Attempts      int
	Claims        int
	Checks        int
	LeaseUntil    *time.Time
	LeasedBy      string
	NextAttemptAt time.Time
	NextCheckAt   *time.Time
	// LastSentAt is when the last request actually began (not when it was claimed).
	LastSentAt *time.Time
	// ClaimedAt is when the current or last claim was taken.
	ClaimedAt *time.Time
	// InFlightUntil is the latest moment the last request could still have been in flight:
	// its start plus the send Timeout, or the end of its claim, whichever is later. The
	// reconciler's grace period runs from here.
	InFlightUntil *time.Time
	UnknownSince  *time.Time
	ExternalRef   string
	LastError     string
	LastLookup    string
	ManualReason  string
	PayloadHash   []byte
	CreatedAt     time.Time
	UpdatedAt     time.Time
	FinishedAt    *time.Time
	// Version counts the operation's state changes (1 when enqueued). A person's decision
	// carries the version it was taken on (reconcile.ResolveOpts.ExpectedVersion): an
	// operation that left MANUAL and came back MANUAL for another reason has another version.
	Version int64
	// TraceParent is the W3C traceparent of the span that enqueued the operation (inside a
	// workflow step, the step's), or "" when Enqueue's context held none. The spans of its
	// sends and reconciler checks link to it (docs/design.md, *Tracing*).
	TraceParent string
}

// IdempotencyKey is the key a Sender passes to the external system: the operation id.
func (op *Operation) IdempotencyKey() string { return op.ID.String() }

var kindRE = regexp.MustCompile(`^[a-z0-9]+([_-][a-z0-9]+)*$`)
var currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)

// ValidateKind refuses a kind name Enqueue would refuse, with ErrInvalidOperation.
func ValidateKind(kind string) error {
	if kind == "" || len(kind) > MaxKindLen || !kindRE.MatchString(kind) {
		return fmt.Errorf("%w: kind %q: want 1 to %d lower-case letters and digits separated by single '_' or '-', as \"payout\"",
			ErrInvalidOperation, kind, MaxKindLen)
	}
	return nil
}

// prepare validates op and fills its defaults, before any SQL runs, so that a bad operation
// leaves the caller's transaction exactly as it was.
func (op *EnqueueParams) prepare() error {
	if err := ValidateKind(op.Kind); err != nil {
		return err
	}
	if op.BusinessKey == "" || len(op.BusinessKey) > MaxBusinessKeyLen || !utf8.ValidString(op.BusinessKey) {
		return fmt.Errorf("%w: kind %q: business key %q: want 1 to %d bytes of UTF-8",
			ErrInvalidOperation, op.Kind, op.BusinessKey, MaxBusinessKeyLen)
	}
	if op.ID == uuid.Nil {
		op.ID = OperationID(op.Kind, op.BusinessKey)
	}
	if len(op.Payload) == 0 {
		op.Payload = json.RawMessage(`{}`)
	}
	if len(op.Payload) > MaxPayloadBytes {
		return fmt.Errorf("%w: operation %s (%s %q): payload is %d bytes, the limit is %d; store the document in your own table and put its key in the payload",
			ErrPayloadTooLarge, op.ID, op.Kind, op.BusinessKey, len(op.Payload), MaxPayloadBytes)
	}
	if !json.Valid(op.Payload) {
		return fmt.Errorf("%w: operation %s (%s %q): payload is not valid JSON", ErrInvalidOperation, op.ID, op.Kind, op.BusinessKey)
	}
	if op.Currency != "" && !currencyRE.MatchString(op.Currency) {
		return fmt.Errorf("%w: operation %s (%s %q): currency %q: want an ISO 4217 code such as \"EUR\"",
			ErrInvalidOperation, op.ID, op.Kind, op.BusinessKey, op.Currency)
	}
	if op.Amount != 0 && op.Currency == "" {
		return fmt.Errorf("%w: operation %s (%s %q): amount %d without a currency; set Currency",
			ErrInvalidOperation, op.ID, op.Kind, op.BusinessKey, op.Amount)
	}
	return nil
}

// columns is the select list ScanOperation reads (see Columns).
var columns = Columns("stepwise_operation")

// ScanOperation scans a row selected with Columns, followed by any extra destinations.
func ScanOperation(row pgx.Row, extra ...any) (*Operation, error) {
	var op Operation
	var payload []byte
	dest := []any{pgtx.UUIDDest(&op.ID), &op.Kind, &op.BusinessKey, &payload, &op.PayloadHash, &op.Amount, &op.Currency,
		&op.RunKey, &op.State, &op.Attempts, &op.Checks, &op.LeaseUntil, &op.LeasedBy, &op.NextAttemptAt,
		&op.NextCheckAt, &op.LastSentAt, &op.UnknownSince, &op.ExternalRef, &op.LastError,
		&op.LastLookup, &op.ManualReason, &op.CreatedAt, &op.UpdatedAt, &op.FinishedAt,
		&op.Claims, &op.ClaimedAt, &op.InFlightUntil, &op.Version, &op.TraceParent}
	if err := row.Scan(append(dest, extra...)...); err != nil {
		return nil, err
	}
	op.Payload = json.RawMessage(payload)
	return &op, nil
}

// truncateError bounds an error message for the ledger, on a rune boundary.
func truncateError(s string) string {
	if len(s) <= maxErrorLen {
		return s
	}
	cut := maxErrorLen - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
