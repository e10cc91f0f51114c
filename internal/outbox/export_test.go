package outbox

// For the tests in package outbox_test.

type Transition = transition

var TransitionOneTx = (*Outbox).transitionOneTx

// Counts reads the whole ledger's operations per kind and state.
var Counts = counts

// WakeLooksForTest is how many looks o's waker made so far.
func WakeLooksForTest(o *Outbox) int64 { return o.local.WakeLooks() }

// DispatchArgsForTest is the dispatcher's River job args, for tests that insert a
// dispatcher job by hand (a dead one, a takeover).
type DispatchArgsForTest = dispatchArgs
