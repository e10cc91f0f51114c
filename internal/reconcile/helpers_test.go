package reconcile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/reconcile"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) }

// The fake bank wired to the ledger, shared with the other SDK test packages.
type (
	payoutPayload = fakebank.Payload
	bankSender    = fakebank.Sender
	bankChecker   = fakebank.Checker
)

var bankStatement = fakebank.Statement

// bundle is what a reconciliation test works with.
type bundle struct {
	pool   *pgxpool.Pool
	bank   *fakebank.Bank
	client *fakebank.Client
	ob     *outbox.Outbox
	rec    *reconcile.Reconciler
}

// setup builds a bank (no keep-alive: net/http would turn a dropped answer into a transparent
// resend and success), an Outbox and a Reconciler for kind "payout" whose outcome callback logs
// every transition in outcome_log, in the recording transaction: a callback that ran twice
// shows as two rows. mod adjusts the configs before they are built.
func setup(t testing.TB, bankCfg *fakebank.Config, mod func(*outbox.KindConfig, *reconcile.KindConfig)) *bundle {
	t.Helper()
	ctx := context.Background()
	pool := testkit.DB(t)
	_, err := pool.Exec(ctx, `CREATE TABLE outcome_log (operation_id uuid NOT NULL, from_state text NOT NULL, to_state text NOT NULL, actor text NOT NULL)`)
	require.NoError(t, err)

	bank := fakebank.New(bankCfg)
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	client := fakebank.NewClient(bank.URL(), &http.Client{Timeout: 10 * time.Second, Transport: tr})

	okc := &outbox.KindConfig{
		Sender:       bankSender{Client: client},
		Timeout:      time.Second,
		RetryBackoff: func(int) time.Duration { return 0 },
		OnOutcome: func(ctx context.Context, tx pgx.Tx, op *outbox.Operation, oc outbox.Outcome) error {
			_, err := tx.Exec(ctx, `INSERT INTO outcome_log VALUES ($1, $2, $3, $4)`, op.ID, oc.From, oc.To, oc.Actor)
			return err
		},
	}
	rkc := &reconcile.KindConfig{
		Checker:      bankChecker{Client: client},
		Grace:        time.Hour, // tests move last_sent_at back instead of waiting
		CheckBackoff: func(int) time.Duration { return time.Hour },
	}
	if mod != nil {
		mod(okc, rkc)
	}
	discard := slog.New(slog.DiscardHandler)
	ob, err := outbox.New(pool, &outbox.Config{ID: "test", Logger: discard, Kinds: map[string]*outbox.KindConfig{"payout": okc}})
	require.NoError(t, err)
	require.NoError(t, ob.Register(ctx))
	rec, err := reconcile.New(pool, &reconcile.Config{Outbox: ob, Logger: discard, Kinds: map[string]*reconcile.KindConfig{"payout": rkc}})
	require.NoError(t, err)
	return &bundle{pool: pool, bank: bank, client: client, ob: ob, rec: rec}
}

func payout(key, account string, amount int64) outbox.EnqueueParams {
	p, _ := json.Marshal(payoutPayload{Account: account})
	return outbox.EnqueueParams{Kind: "payout", BusinessKey: key, Payload: p, Amount: amount, Currency: "EUR"}
}

func (b *bundle) enqueue(t testing.TB, ops ...outbox.EnqueueParams) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, ops...)
		return err
	}))
}

// paidButUnknown enqueues payouts key(0) to key(n-1) (100+i cents each), which the bank applies
// and answers with a 5xx, and drains them: n operations UNKNOWN_EXTERNAL, every payment made.
func (b *bundle) paidButUnknown(t testing.TB, n int) {
	t.Helper()
	var ops []outbox.EnqueueParams
	for i := range n {
		ops = append(ops, payout(key(i), "acct", int64(100+i)))
		b.bank.FailKey(outbox.OperationID("payout", key(i)).String(), fakebank.Error5xxAfterApply)
	}
	b.enqueue(t, ops...)
	b.drain(t)
	require.Equal(t, int64(n), b.counts(t)[outbox.StateUnknownExternal])
}

func (b *bundle) drain(t testing.TB) {
	t.Helper()
	_, err := b.ob.Drain(context.Background(), "payout")
	require.NoError(t, err)
}

func (b *bundle) get(t testing.TB, key string) *outbox.Operation {
	t.Helper()
	op, err := outbox.Get(context.Background(), b.pool, outbox.OperationID("payout", key))
	require.NoError(t, err)
	return op
}

// callbacks returns the logged outcome callbacks of an operation, as "FROM>TO".
func (b *bundle) callbacks(t testing.TB, id uuid.UUID) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT from_state || '>' || to_state FROM outcome_log WHERE operation_id = $1 ORDER BY ctid`, id)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// sentLongAgo moves an operation's last send (and the end of its time in flight) two hours back, past any grace period, and makes
// it due for a check: what waiting would do, without the wait.
func (b *bundle) sentLongAgo(t testing.TB, key string) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), `UPDATE stepwise_operation
		SET last_sent_at = last_sent_at - interval '2 hours', in_flight_until = in_flight_until - interval '2 hours', next_check_at = now() WHERE operation_id = $1`,
		outbox.OperationID("payout", key))
	require.NoError(t, err)
}

func (b *bundle) counts(t testing.TB) map[outbox.State]int64 {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT state, count(*) FROM stepwise_operation GROUP BY state`)
	require.NoError(t, err)
	out := map[outbox.State]int64{}
	var state outbox.State
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&state, &n}, func() error { out[state] = n; return nil })
	require.NoError(t, err)
	return out
}

func key(i int) string { return fmt.Sprintf("settle/m-%05d", i) }

// registerPayout registers kind "payout" in the test's database, as a delivering process
// would, so that Enqueue accepts it.
func registerPayout(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	ob, err := outbox.New(pool, &outbox.Config{ID: "register", Logger: slog.New(slog.DiscardHandler),
		Kinds: map[string]*outbox.KindConfig{"payout": {Sender: outbox.SendFunc(func(context.Context, *outbox.Operation) (outbox.Receipt, error) {
			return outbox.Receipt{}, outbox.NotSent(nil)
		})}}})
	require.NoError(t, err)
	require.NoError(t, ob.Register(context.Background()))
}
