package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) }

// The fake bank wired to the ledger, shared with the other SDK test packages.
type (
	payoutPayload = fakebank.Payload
	bankSender    = fakebank.Sender
)

// startBank starts a fake bank for the test. keepAlive false gives every request its own
// connection. (Either way a dropped answer stays one: the fake bank's client sends through
// outbox/httpsend, so net/http never resends a payment by itself on a new connection.)
func startBank(t testing.TB, cfg *fakebank.Config, timeout time.Duration, keepAlive bool) (*fakebank.Bank, *fakebank.Client) {
	t.Helper()
	bank := fakebank.New(cfg)
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = !keepAlive
	tr.MaxIdleConnsPerHost = 256
	hc := &http.Client{Timeout: timeout, Transport: tr}
	t.Cleanup(tr.CloseIdleConnections)
	return bank, fakebank.NewClient(bank.URL(), hc)
}

// payout builds a payout operation of amount cents to account.
func payout(key, account string, amount int64) outbox.EnqueueParams {
	p, _ := json.Marshal(payoutPayload{Account: account})
	return outbox.EnqueueParams{Kind: "payout", BusinessKey: key, Payload: p, Amount: amount, Currency: "EUR"}
}

// enqueue commits ops in a transaction of their own.
func enqueue(t testing.TB, pool *pgxpool.Pool, ops ...outbox.EnqueueParams) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, ops...)
		return err
	})
	require.NoError(t, err)
}

func get(t testing.TB, pool *pgxpool.Pool, id uuid.UUID) *outbox.Operation {
	t.Helper()
	op, err := outbox.Get(context.Background(), pool, id)
	require.NoError(t, err)
	return op
}

// stateCounts returns the number of operations per state.
func stateCounts(t testing.TB, pool *pgxpool.Pool) map[outbox.State]int64 {
	t.Helper()
	counts, err := outbox.Counts(context.Background(), pool)
	require.NoError(t, err)
	out := map[outbox.State]int64{}
	for _, c := range counts {
		out[c.State] += c.Count
	}
	return out
}

// events returns the audit transitions of an operation, as "FROM>TO".
func events(t testing.TB, pool *pgxpool.Pool, id uuid.UUID) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT coalesce(from_state, '') || '>' || to_state FROM stepwise_event WHERE subject = $1 ORDER BY id`, "op:"+id.String())
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// newOutbox builds an Outbox for kind "payout" with the given sender; mod adjusts the kind.
func newOutbox(t testing.TB, pool *pgxpool.Pool, sender outbox.Sender, mod func(*outbox.KindConfig)) *outbox.Outbox {
	t.Helper()
	kc := &outbox.KindConfig{
		Sender:       sender,
		Timeout:      2 * time.Second,
		RetryBackoff: func(int) time.Duration { return 0 },
	}
	if mod != nil {
		mod(kc)
	}
	ob, err := outbox.New(pool, &outbox.Config{ID: "test", Logger: slog.New(slog.DiscardHandler),
		Kinds: map[string]*outbox.KindConfig{"payout": kc}})
	require.NoError(t, err)
	require.NoError(t, ob.Register(context.Background()))
	return ob
}

// registerPayout registers kind "payout" in the test's database, as a delivering process
// would, so that Enqueue accepts it.
func registerPayout(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	newOutbox(t, pool, outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
		return outbox.Receipt{}, outbox.NotSent(nil)
	}), nil)
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a logger's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
