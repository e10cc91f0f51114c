package httpsend_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/google/uuid"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/outbox/httpsend"
)

// PayoutSender is an outbox Sender for an HTTP payout service that documents 422 as a final
// decline and 429 with X-Not-Processed as "not processed, send again".
type PayoutSender struct {
	URL    string
	Client *http.Client
}

var payoutRules = httpsend.Rules{
	Refused: func(a *httpsend.Answer) bool { return a.Status == http.StatusUnprocessableEntity },
	NotProcessed: func(a *httpsend.Answer) bool {
		return a.Status == http.StatusTooManyRequests && a.Header.Get("X-Not-Processed") == "true"
	},
}

func (s PayoutSender) Send(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/payouts", bytes.NewReader(op.Payload))
	if err != nil {
		return outbox.Receipt{}, outbox.NotSent(err) // nothing was sent
	}
	req.Header.Set("Idempotency-Key", op.IdempotencyKey())
	req.Header.Set("Content-Type", "application/json")
	ans, err := httpsend.Do(s.Client, req)
	if err != nil {
		return outbox.Receipt{}, err // outbox.NotSent only when the wire proves it
	}
	if err := payoutRules.Classify(ans); err != nil {
		return outbox.Receipt{}, err
	}
	return outbox.Receipt{ExternalRef: string(ans.Body)}, nil
}

func ExampleDo() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "" {
			http.Error(w, "no key", http.StatusBadRequest)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "po_1")
	}))
	defer srv.Close()

	s := PayoutSender{URL: srv.URL, Client: srv.Client()}
	op := &outbox.Operation{EnqueueParams: outbox.EnqueueParams{ID: uuid.New(), Kind: "payout", Payload: []byte(`{"account":"m-7"}`)}}
	receipt, err := s.Send(context.Background(), op)
	fmt.Println(receipt.ExternalRef, outbox.Classify(err))

	srv.Close() // the service is gone: a new connection is refused, provably not sent
	_, err = s.Send(context.Background(), op)
	fmt.Println(outbox.Classify(err))
	// Output:
	// po_1 SUCCEEDED
	// RETRYABLE
}
