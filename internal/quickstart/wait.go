// The README's wait example, compiled: the code between the README WAIT markers is the
// README's "Runs that wait" block (docs/readme_test.go compares them).
package quickstart

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stepwise-go/stepwise/workflow"
)

type CloseArgs struct {
	Date string `json:"date"`
}

func (CloseArgs) Kind() string { return "close" }

type CloseCursor struct {
	Phase string `json:"phase"`
}

type CloseWorker struct {
	workflow.StepperDefaults[CloseArgs, CloseCursor]
}

// README WAIT BEGIN
func (w *CloseWorker) Step(ctx context.Context, s *workflow.Step[CloseArgs, CloseCursor]) (workflow.Next, error) {
	switch s.Cursor.Phase {
	case "": // settle and enqueue the date's payouts, as in the quick start; then:
		s.Cursor.Phase = "payouts-sent"
		return workflow.WaitForOperations(6 * time.Hour), nil // no worker, no lease while the bank answers
	case "payouts-sent":
		if woken := s.Woken(); woken.TimedOut || woken.Operations["MANUAL"] > 0 {
			return workflow.Fail(errNotProven(s.Args.Date, woken.Operations)), nil // visible; resume when resolved
		}
		s.Cursor.Phase = "proven"
		return workflow.WaitForSignal("statement", 12*time.Hour), nil // the bank's file has arrived
	case "proven": // every payout proven and the statement here: close the date in this step's tx
		if err := closeDate(ctx, s.Tx, s.Args.Date, s.Woken().Signal.Payload); err != nil {
			return workflow.Next{}, err
		}
		return workflow.Done(), nil
	}
	return workflow.Next{}, fmt.Errorf("unknown phase %q", s.Cursor.Phase)
}

// Elsewhere (an HTTP handler, a command), in your own transaction; sent twice with one id,
// it counts once, and sent before the run waits, it is kept:
func StatementArrived(ctx context.Context, tx pgx.Tx, date, fileID string) error {
	return workflow.Signal(ctx, tx, "close/"+date, "statement", fileID, map[string]string{"file": fileID})
}

// README WAIT END

// errNotProven and closeDate are the business the README leaves to the reader.
func errNotProven(date string, ops map[string]int) error {
	return fmt.Errorf("date %s: payouts not proven: %v", date, ops)
}

func closeDate(ctx context.Context, tx pgx.Tx, date string, statement []byte) error {
	_, err := tx.Exec(ctx, `SELECT $1::text, $2::jsonb`, date, statement)
	return err
}
