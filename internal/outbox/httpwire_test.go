package outbox_test

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

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// dialMeansNotSent is an HTTP Sender as NotSent's documentation used to guide one: the key in
// the canonical Idempotency-Key header, a plain http.Client, and a dial error ("connection
// refused") taken for "never left".
type dialMeansNotSent struct {
	url string
	hc  *http.Client
}

func (s dialMeansNotSent) Send(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
	var p payoutPayload
	if err := json.Unmarshal(op.Payload, &p); err != nil {
		return outbox.Receipt{}, outbox.Permanent(err)
	}
	body, _ := json.Marshal(fakebank.PaymentRequest{Account: p.Account, Amount: op.Amount, Currency: op.Currency, Reference: op.BusinessKey})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/payments", bytes.NewReader(body))
	if err != nil {
		return outbox.Receipt{}, outbox.NotSent(err)
	}
	req.Header.Set("Idempotency-Key", op.IdempotencyKey())
	resp, err := s.hc.Do(req)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Op == "dial" {
			return outbox.Receipt{}, outbox.NotSent(err)
		}
		return outbox.Receipt{}, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return outbox.Receipt{}, fmt.Errorf("%d: %s", resp.StatusCode, data)
	}
	return outbox.Receipt{ExternalRef: "paid"}, nil
}

// TestDeliveryThroughAKeptAliveConnectionThatDies: the ledger's side of the hostile regime.
// A strict bank (no deduplication) applies each payout, then crashes (CrashAfterApply: the
// connection dies, the port is closed until it comes back). With a Sender that takes the
// resend's "connection refused" for "never left", the ledger records RETRYABLE and the
// outbox sends the payout again: paid twice. With fakebank.Sender (outbox/httpsend) every
// payout is UNKNOWN_EXTERNAL after one request, paid once, for the reconciler to prove.
func TestDeliveryThroughAKeptAliveConnectionThatDies(t *testing.T) {
	t.Parallel()
	const n = 30
	run := func(t *testing.T, newSender func(url string, hc *http.Client) outbox.Sender) (paidTwice int, states map[outbox.State]int, attempts map[int]int) {
		ctx := context.Background()
		pool := testkit.DB(t)
		bank, _ := startBank(t, &fakebank.Config{Strict: true}, 5*time.Second, true)
		tr := &http.Transport{} // kept alive, as a service's client is
		t.Cleanup(tr.CloseIdleConnections)
		hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
		ob := newOutbox(t, pool, newSender(bank.URL(), hc), nil)
		states, attempts = map[outbox.State]int{}, map[int]int{}
		for i := range n {
			key := fmt.Sprintf("settle/%d", i)
			id := outbox.OperationID("payout", key)
			enqueue(t, pool, payout(key, "merchant-7", 1250))
			// A statement read first, so that the payout goes out on a kept-alive connection
			// that has carried a request: the one net/http resends on when it dies.
			resp, err := hc.Get(bank.URL() + "/statement?currency=XXX")
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			require.NoError(t, resp.Body.Close())
			bank.FailKey(id.String(), fakebank.CrashAfterApply)
			_, err = ob.DeliverBatch(ctx, "payout")
			require.NoError(t, err)
			require.NoError(t, bank.SetDown(false)) // back before the retry's backoff ends
			_, err = ob.Drain(ctx, "payout")
			require.NoError(t, err)
			op := get(t, pool, id)
			states[op.State]++
			attempts[op.Attempts]++
			if bank.Effects(id.String()) > 1 {
				paidTwice++
			}
		}
		return paidTwice, states, attempts
	}

	t.Run("Control/DialMeansNotSent", func(t *testing.T) {
		t.Parallel()
		paidTwice, states, attempts := run(t, func(url string, hc *http.Client) outbox.Sender {
			return dialMeansNotSent{url: url, hc: hc}
		})
		t.Logf("dial means not sent: %d of %d payouts paid twice; states %v; requests per payout %v", paidTwice, n, states, attempts)
		require.Positive(t, paidTwice, "the regime is not hostile: net/http resent nothing")
	})
	t.Run("FakebankSender", func(t *testing.T) {
		t.Parallel()
		paidTwice, states, attempts := run(t, func(url string, hc *http.Client) outbox.Sender {
			return bankSender{Client: fakebank.NewClient(url, hc)}
		})
		t.Logf("fakebank.Sender: %d of %d payouts paid twice; states %v; requests per payout %v", paidTwice, n, states, attempts)
		require.Zero(t, paidTwice)
		require.Equal(t, map[outbox.State]int{outbox.StateUnknownExternal: n}, states)
		require.Equal(t, map[int]int{1: n}, attempts)
	})
}
