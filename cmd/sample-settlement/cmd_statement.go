package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/console"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

func init() {
	prog.Register("statement-arrived", "tell the date's reconciliation run that the bank's statement arrived (a durable signal; sent twice with one --id, it counts once)", runStatementArrived)
}

func runStatementArrived(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := prog.NewFlagSet("statement-arrived", "statement-arrived --date YYYY-MM-DD [--id STATEMENT_ID]", stderr)
	var db dbFlags
	db.register(fs)
	date := fs.String("date", "", "business date the statement covers, YYYY-MM-DD (required)")
	id := fs.String("id", "", "the statement's id, e.g. the bank's file name: a retried send with the same id counts once (default \"bank-statement/<date>\": one statement per date)")
	if err := cmdline.ParseFlags(fs, args, false); err != nil {
		return err
	}
	d, err := parseDateFlag(*date)
	if err != nil {
		return err
	}
	if err := checkStatementID("--id", *id); err != nil {
		return err
	}
	pool, err := db.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := settlement.StatementArrived(ctx, pool, d, *id); err != nil {
		return err
	}
	key := settlement.ReconcileRunKey(d)
	fmt.Fprintf(stdout, "statement for %s sent to run %s\n", *date, key)
	client, err := stepwise.NewOperatorClient(pool)
	if err != nil {
		return err
	}
	run, err := client.RunGet(ctx, key)
	switch {
	case errors.Is(err, stepwisetype.ErrNotFound):
		fmt.Fprintf(stdout, "the run does not exist yet (the date is not closed): the statement is kept for it\n")
	case err != nil:
		return err
	case run.Wait != nil:
		fmt.Fprintf(stdout, "the run waits: %s\n", run.Wait.Missing)
	default:
		fmt.Fprintf(stdout, "the run is %s; the statement is kept until it waits for one\n", run.Status)
	}
	return nil
}

// checkStatementID refuses a statement id a signal cannot carry or a log should not print:
// empty is allowed (the default), else 1 to 255 bytes of printable characters.
func checkStatementID(what, id string) error {
	if len(id) > 255 {
		return cmdline.UsageError("%s: %d bytes; want at most 255", what, len(id))
	}
	if strings.IndexFunc(id, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return cmdline.UsageError("%s %q: want printable characters only", what, id)
	}
	return nil
}

// statementRequest is the body of serve's POST /ops/statement.
type statementRequest struct {
	Date string `json:"date"`
	// ID is the statement's id; the Idempotency-Key header is taken when it is empty.
	ID string `json:"id"`
}

// statementHandler is serve's POST /ops/statement: statement-arrived over HTTP, for the job
// that fetches the bank's statement files. It answers 202 once the signal is stored (sent
// again with the same id, the same answer and one signal). Behind console.Protect: writes
// need the operators' credentials, and a server error's body is generic (the detail is in
// the log; the status and Retry-After say to retry, and the same id counts once).
func statementHandler(pool *pgxpool.Pool, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			console.CloseUnreadBody(w, r)
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST a JSON body {\"date\": \"YYYY-MM-DD\", \"id\": \"STATEMENT_ID\"}", http.StatusMethodNotAllowed)
			return
		}
		var req statementRequest
		dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			http.Error(w, "bad body: want {\"date\": \"YYYY-MM-DD\", \"id\": \"STATEMENT_ID\"}", http.StatusBadRequest)
			return
		}
		if req.ID == "" {
			req.ID = r.Header.Get("Idempotency-Key")
		}
		d, err := settlement.ParseDate(req.Date)
		if err != nil {
			http.Error(w, "bad date: want YYYY-MM-DD", http.StatusBadRequest)
			return
		}
		if err := checkStatementID("id", req.ID); err != nil {
			http.Error(w, strings.TrimPrefix(err.Error(), cmdline.ErrUsage.Error()+": "), http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		if err := settlement.StatementArrived(ctx, pool, d, req.ID); err != nil {
			logger.Warn("storing a statement signal", "date", req.Date, "err", err)
			unavailable(w, "could not store the signal; retry with the same id")
			return
		}
		logger.Info("statement arrived", "date", req.Date, "id", req.ID, "run", settlement.ReconcileRunKey(d))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(map[string]string{"date": req.Date, "run": settlement.ReconcileRunKey(d), "status": "stored"})
	})
}
