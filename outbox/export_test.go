package outbox

import (
	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/internal/ledger"
)

// For the tests in package outbox_test: the plumbing reconcile and console reach through
// internal/ledger.

type Transition = transition

var (
	TransitionOneTx = (*Outbox).transitionOneTx
	Columns         = ledger.Columns
)

// Counts reads the whole ledger's operations per kind and state.
var Counts = counts

func ScanOperation(row pgx.Row, extra ...any) (*Operation, error) {
	return scanOperation(row, extra...)
}

// WakeLooksForTest is how many looks the process's wakers made so far.
func WakeLooksForTest() int64 { return wakeLooks.Load() }

// DispatchArgsForTest is the dispatcher's River job args, for tests that insert a
// dispatcher job by hand (a dead one, a takeover).
type DispatchArgsForTest = dispatchArgs
