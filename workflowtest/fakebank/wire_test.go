package fakebank

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/outbox/httpsend"
)

// docsSender is a Sender written as outbox.NotSent's documentation used to say: net/http
// with the idempotency key in the canonical Idempotency-Key header, and "connection refused"
// (a dial error) read as proof that the request never left. It is the control of
// TestSenderPaysOnceWhenTheConnectionDies: it shows the regime is hostile.
type docsSender struct {
	url string
	hc  *http.Client
}

func (s docsSender) Send(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
	var p Payload
	if err := json.Unmarshal(op.Payload, &p); err != nil {
		return outbox.Receipt{}, outbox.Permanent(err)
	}
	body, _ := json.Marshal(PaymentRequest{Account: p.Account, Amount: op.Amount, Currency: op.Currency, Reference: op.BusinessKey})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/payments", bytes.NewReader(body))
	if err != nil {
		return outbox.Receipt{}, outbox.NotSent(err)
	}
	req.Header.Set("Idempotency-Key", op.IdempotencyKey())
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.hc.Do(req)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Op == "dial" { // "connection refused: it never left"
			return outbox.Receipt{}, outbox.NotSent(err)
		}
		return outbox.Receipt{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return outbox.Receipt{}, err
	case resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusCreated:
		var pay Payment
		if err := json.Unmarshal(data, &pay); err != nil {
			return outbox.Receipt{}, err
		}
		return outbox.Receipt{ExternalRef: pay.ID}, nil
	case resp.StatusCode == http.StatusUnprocessableEntity:
		return outbox.Receipt{}, outbox.Permanent(fmt.Errorf("declined: %s", data))
	case resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get(HeaderNotProcessed) == "true":
		return outbox.Receipt{}, outbox.NotSent(fmt.Errorf("not processed: %s", data))
	}
	return outbox.Receipt{}, fmt.Errorf("%d: %s", resp.StatusCode, data)
}

// keepAliveClient is a client as a service runs one: kept-alive connections, pooled.
func keepAliveClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Timeout: 5 * time.Second, Transport: tr}
}

// deliverLikeTheOutbox sends op as the outbox does: again, under the same id, for as long as
// the Sender's result classifies RETRYABLE (the bank, down after a crash, is back by the
// time the backoff has run out), and never after any other result. It returns the final
// state and the first send's error.
func deliverLikeTheOutbox(t *testing.T, bank *Bank, s outbox.Sender, op *outbox.Operation) (outbox.State, error) {
	t.Helper()
	var first error
	for i := range 5 {
		_, err := s.Send(context.Background(), op)
		if i == 0 {
			first = err
		}
		st := outbox.Classify(err)
		if st != outbox.StateRetryable {
			return st, first
		}
		require.NoError(t, bank.SetDown(false))
	}
	t.Fatalf("operation %s still RETRYABLE after 5 sends", op.ID)
	return "", nil
}

// warm makes the client's next request go out on a kept-alive connection that has already
// carried one: the one net/http resends on when it dies.
func warm(t *testing.T, hc *http.Client, url string) {
	t.Helper()
	resp, err := hc.Get(url + "/statement?currency=XXX")
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
}

// TestSenderPaysOnceWhenTheConnectionDies is the hostile regime of a kept-alive HTTP client
// and a bank that does not deduplicate (strict): the bank applies a payment, then the
// connection dies without an answer, either alone (DropAfterApply) or with the bank
// (CrashAfterApply: new connections are refused until it is back). A Sender written as
// NotSent's documentation used to say pays twice: net/http resends the request by itself,
// and the resend either pays again or meets "connection refused", which that Sender reads
// as never sent, so the outbox sends it again. fakebank.Sender, built on httpsend.Do, pays
// each operation exactly once over every trial, and never calls one of these failures not
// sent.
func TestSenderPaysOnceWhenTheConnectionDies(t *testing.T) {
	t.Parallel()
	const trials = 200
	faults := []Fault{CrashAfterApply, DropAfterApply}

	type result struct {
		dup    map[Fault]int        // operations paid more than once, by fault
		states map[outbox.State]int // final states
		first  map[Fault]error      // the first send's error, of the last trial of each fault
	}
	run := func(t *testing.T, n int, newSender func(url string, hc *http.Client) outbox.Sender) result {
		bank, _ := setup(t, &Config{Strict: true})
		hc := keepAliveClient(t)
		s := newSender(bank.URL(), hc)
		res := result{dup: map[Fault]int{}, states: map[outbox.State]int{}, first: map[Fault]error{}}
		for i := range n {
			op := &outbox.Operation{EnqueueParams: outbox.EnqueueParams{
				ID: uuid.New(), Kind: "payout", BusinessKey: fmt.Sprintf("settle/%d", i),
				Payload: json.RawMessage(`{"account":"merchant-7"}`), Amount: 1250, Currency: "EUR",
			}}
			fault := faults[i%len(faults)]
			warm(t, hc, bank.URL())
			bank.FailKey(op.IdempotencyKey(), fault)
			st, first := deliverLikeTheOutbox(t, bank, s, op)
			require.NoError(t, bank.SetDown(false))
			res.states[st]++
			res.first[fault] = first
			if bank.Effects(op.IdempotencyKey()) != 1 {
				res.dup[fault]++
			}
		}
		return res
	}

	t.Run("Control/NetHTTPAsNotSentUsedToSay", func(t *testing.T) {
		t.Parallel()
		const n = 20
		res := run(t, n, func(url string, hc *http.Client) outbox.Sender { return docsSender{url: url, hc: hc} })
		t.Logf("net/http Sender as NotSent used to say: of %d operations, paid more than once: %v; final states %v; first sends: %v",
			n, res.dup, res.states, res.first)
		// Without this the regime proves nothing: the transport must really resend.
		require.Positive(t, res.dup[CrashAfterApply]+res.dup[DropAfterApply], "the regime is not hostile: net/http resent nothing")
	})

	for _, tt := range []struct {
		name      string
		newSender func(url string, hc *http.Client) outbox.Sender
	}{
		{"FakebankSender", func(url string, hc *http.Client) outbox.Sender { return Sender{Client: NewClient(url, hc)} }},
		{"HTTPSendAsDocumented", func(url string, hc *http.Client) outbox.Sender { return httpsendSender{url: url, hc: hc} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res := run(t, trials, tt.newSender)
			t.Logf("%s: of %d operations, paid more than once: %v; final states %v; first sends: %v", tt.name, trials, res.dup, res.states, res.first)
			require.Empty(t, res.dup)
			// Every one was applied and lost its answer: UNKNOWN_EXTERNAL, for the
			// reconciler, never resent on a guess.
			require.Equal(t, map[outbox.State]int{outbox.StateUnknownExternal: trials}, res.states)
			for f, err := range res.first {
				var he *httpsend.Error
				require.ErrorAs(t, err, &he, "%s", f)
				require.True(t, he.Wire.Reused && he.Wire.HeadersWritten && !he.Wire.Replayed, "%s: %+v", f, he.Wire)
			}
		})
	}
}

// httpsendSender is the Sender httpsend's documentation shows, for the fake bank.
type httpsendSender struct {
	url string
	hc  *http.Client
}

var bankRules = httpsend.Rules{
	Refused: func(a *httpsend.Answer) bool { return a.Status == http.StatusUnprocessableEntity },
	NotProcessed: func(a *httpsend.Answer) bool {
		return a.Status == http.StatusTooManyRequests && a.Header.Get(HeaderNotProcessed) == "true"
	},
}

func (s httpsendSender) Send(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
	var p Payload
	if err := json.Unmarshal(op.Payload, &p); err != nil {
		return outbox.Receipt{}, outbox.Permanent(err)
	}
	body, _ := json.Marshal(PaymentRequest{Account: p.Account, Amount: op.Amount, Currency: op.Currency, Reference: op.BusinessKey})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/payments", bytes.NewReader(body))
	if err != nil {
		return outbox.Receipt{}, outbox.NotSent(err)
	}
	req.Header.Set("Idempotency-Key", op.IdempotencyKey())
	req.Header.Set("Content-Type", "application/json")
	ans, err := httpsend.Do(s.hc, req)
	if err != nil {
		return outbox.Receipt{}, err
	}
	if err := bankRules.Classify(ans); err != nil {
		return outbox.Receipt{}, err
	}
	var pay Payment
	if err := json.Unmarshal(ans.Body, &pay); err != nil {
		return outbox.Receipt{}, err
	}
	return outbox.Receipt{ExternalRef: pay.ID}, nil
}

// TestCrashAfterApply: the bank applies, then goes off the network; the caller's request is
// ambiguous (it was written), the next one is refused before it is written, and the bank
// comes back on the same port.
func TestCrashAfterApply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bank, bundle := setup(t, nil)
	bank.FailKey("op-1", CrashAfterApply)

	_, err := bundle.client.Pay(ctx, "op-1", payReq("settle-1", 100))
	require.Error(t, err)
	require.False(t, IsNotProcessed(err), "%v", err)
	require.Equal(t, 1, bank.Effects("op-1"))
	log := bank.Requests()
	require.Len(t, log, 1)
	require.Equal(t, OutcomeApplied, log[0].Outcome)
	require.False(t, log[0].Answered.IsZero())

	_, err = bundle.client.Pay(ctx, "op-1", payReq("settle-1", 100))
	require.True(t, IsNotProcessed(err), "%v", err)
	require.ErrorContains(t, err, "connection refused")

	require.NoError(t, bank.SetDown(false))
	p, err := bundle.client.Pay(ctx, "op-1", payReq("settle-1", 100))
	require.NoError(t, err)
	require.Equal(t, 1, bank.Effects("op-1"), "a replay under the key: the stored payment")
	require.Equal(t, "op-1", p.IdempotencyKey)
}
