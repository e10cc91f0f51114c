package settlement

// DatePayoutsSQL exports the date's payout query to the tests of its plan.
const DatePayoutsSQL = datePayoutsSQL

// The other date-limited queries of report and invariants, for the same tests.
const (
	Invariant1bSQL      = invariant1bSQL
	Invariant4LapsedSQL = invariant4LapsedSQL
	OldestUnknownSQL    = oldestUnknownSQL
)

// ClosedDateAtRest is the name of invariant 4's check on a closed date.
const ClosedDateAtRest = closedDateAtRest

// ReferenceOfDate is referenceOfDate, for the test of both key shapes.
var ReferenceOfDate = referenceOfDate
