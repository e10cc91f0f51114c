package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/internal/testkit"
)

func TestDatedOperationIDSortsByDate(t *testing.T) {
	t.Parallel()
	d := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	id := outbox.DatedOperationID(d, "payout", "2026-03-01/M000042/pos/EUR")

	require.Equal(t, id, outbox.DatedOperationID(d, "payout", "2026-03-01/M000042/pos/EUR"), "the same date, kind and key give the same id")
	require.NotEqual(t, id, outbox.DatedOperationID(d, "payout", "2026-03-01/M000043/pos/EUR"))
	require.NotEqual(t, id, outbox.DatedOperationID(d, "refund", "2026-03-01/M000042/pos/EUR"))
	require.NotEqual(t, id, outbox.OperationID("payout", "2026-03-01/M000042/pos/EUR"))
	require.Equal(t, uuid.Version(8), id.Version())
	require.Equal(t, uuid.RFC4122, id.Variant())
	// The first 48 bits are the date's midnight in Unix milliseconds, as a UUID v7 reads.
	require.Equal(t, "019c", id.String()[:4])
	var ms int64
	for _, b := range id[:6] {
		ms = ms<<8 | int64(b)
	}
	require.Equal(t, d.UnixMilli(), ms)

	// Fixed forever, like OperationID's: ids already sent to a bank must come out the same
	// from every later release. (Computed independently: SHA-1 of the namespace's bytes and
	// "payout\x00" + key, the date's Unix milliseconds over the first six bytes, version 8.)
	require.Equal(t, "019ca6b1-dc00-8d78-87a5-ac6f57c3b135", id.String())

	// The instant decides, in UTC, whatever location it is shown in: midnight UTC read back
	// from a timestamptz on a host in New York (19:00 the day before, local) is the same day,
	// and so is any time of that UTC day.
	newYork, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	require.Equal(t, id, outbox.DatedOperationID(d.In(newYork), "payout", "2026-03-01/M000042/pos/EUR"))
	require.Equal(t, id, outbox.DatedOperationID(d.Add(23*time.Hour+59*time.Minute), "payout", "2026-03-01/M000042/pos/EUR"))
	require.NotEqual(t, id, outbox.DatedOperationID(d.Add(-time.Minute), "payout", "2026-03-01/M000042/pos/EUR"))

	// Before 1970 the date part is zero; the hash still tells operations apart.
	old := outbox.DatedOperationID(time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC), "payout", "a")
	require.Equal(t, "00000000-0000", old.String()[:13])
	require.NotEqual(t, old, outbox.DatedOperationID(time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC), "payout", "b"))

	// Every id of a date sorts after every id of the date before, as bytes (PostgreSQL's uuid
	// order) and as text (the audit events' subject, "op:" || id).
	var last uuid.UUID
	for day := range 400 {
		date := d.AddDate(0, 0, day)
		lo, hi := uuid.Max, uuid.Nil
		for m := range 50 {
			id := outbox.DatedOperationID(date, "payout", fmt.Sprintf("M%06d/%d", m, day))
			if bytes.Compare(id[:], lo[:]) < 0 {
				lo = id
			}
			if bytes.Compare(id[:], hi[:]) > 0 {
				hi = id
			}
		}
		if day > 0 {
			require.Negative(t, bytes.Compare(last[:], lo[:]), "date %s", date.Format(time.DateOnly))
			require.Less(t, last.String(), lo.String(), "date %s", date.Format(time.DateOnly))
		}
		last = hi
	}
}

// A day's dated ids are one range of the ledger's primary key, and of the events' subject in
// the database's own collation, whatever the years of operations around them; random ids
// (OperationID) are spread over the whole of it. That range is what keeps a years-long ledger
// as cheap to write as a new one.
func TestDatedOperationIDsOfADayAreOneRangeOfTheLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	registerPayout(t, pool)

	day := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	var history []outbox.EnqueueParams
	for d := range 60 {
		for m := range 50 {
			date := day.AddDate(0, 0, d-30)
			op := payout(fmt.Sprintf("%s/M%06d", date.Format(time.DateOnly), m), "acct", 1)
			op.ID = outbox.DatedOperationID(date, op.Kind, op.BusinessKey)
			history = append(history, op)
			if m%2 == 0 {
				op = payout(fmt.Sprintf("random/%s/M%06d", date.Format(time.DateOnly), m), "acct", 1)
				history = append(history, op)
			}
		}
	}
	enqueue(t, pool, history...)
	_, err := pool.Exec(ctx, `INSERT INTO stepwise_event (subject, kind) SELECT 'op:' || operation_id, 'test' FROM stepwise_operation`)
	require.NoError(t, err)

	// The operations of `day` whose ids are dated: how many rows sort between the first and the
	// last of them, by id and by subject.
	var dated, byID, bySubject int
	require.NoError(t, pool.QueryRow(ctx, `
		WITH d AS (SELECT operation_id FROM stepwise_operation WHERE business_key LIKE '2026-03-01/%')
		SELECT (SELECT count(*) FROM d),
		       (SELECT count(*) FROM stepwise_operation WHERE operation_id BETWEEN (SELECT operation_id FROM d ORDER BY 1 LIMIT 1) AND (SELECT operation_id FROM d ORDER BY 1 DESC LIMIT 1)),
		       (SELECT count(*) FROM stepwise_event WHERE kind = 'test' AND subject BETWEEN (SELECT min('op:' || operation_id) FROM d) AND (SELECT max('op:' || operation_id) FROM d))`).
		Scan(&dated, &byID, &bySubject))
	require.Equal(t, 50, dated)
	require.Equal(t, dated, byID, "a day's dated ids are one range of the primary key")
	require.Equal(t, dated, bySubject, "and of the events' subject")

	var random, randomRange int
	require.NoError(t, pool.QueryRow(ctx, `
		WITH d AS (SELECT operation_id FROM stepwise_operation WHERE business_key LIKE 'random/2026-03-01/%')
		SELECT (SELECT count(*) FROM d),
		       (SELECT count(*) FROM stepwise_operation WHERE operation_id BETWEEN (SELECT operation_id FROM d ORDER BY 1 LIMIT 1) AND (SELECT operation_id FROM d ORDER BY 1 DESC LIMIT 1))`).
		Scan(&random, &randomRange))
	require.Equal(t, 25, random)
	require.Greater(t, randomRange, 1000, "random ids of one day spread over the whole key")
}

// A step that runs again derives the same dated id and its Enqueue is a no-op; a kind that
// moves from OperationID to DatedOperationID for a key already in the ledger gets a conflict,
// never a second operation.
func TestDatedOperationIDAgainAndAfterASwitch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testkit.DB(t)
	registerPayout(t, pool)
	date := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

	op := payout("2026-03-01/M000001", "acct-1", 100)
	op.ID = outbox.DatedOperationID(date, op.Kind, op.BusinessKey)
	enqueue(t, pool, op)
	again := payout("2026-03-01/M000001", "acct-1", 100)
	again.ID = outbox.DatedOperationID(date, again.Kind, again.BusinessKey)
	var res *outbox.EnqueueResult
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		res, err = outbox.Enqueue(ctx, tx, again)
		return err
	}))
	require.Zero(t, res.Inserted)
	require.Len(t, res.Existing, 1)
	require.Equal(t, op.ID, res.Existing[0].ID)

	old := payout("2026-02-28/M000001", "acct-1", 100)
	enqueue(t, pool, old) // OperationID, before the switch
	switched := old
	switched.ID = outbox.DatedOperationID(date.AddDate(0, 0, -1), old.Kind, old.BusinessKey)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, switched)
		return err
	})
	require.ErrorIs(t, err, outbox.ErrOperationConflict)
	var conflict *outbox.ConflictError
	require.True(t, errors.As(err, &conflict))
	require.Equal(t, outbox.OperationID(old.Kind, old.BusinessKey), conflict.Existing.ID)
	require.Equal(t, map[outbox.State]int64{outbox.StatePending: 2}, stateCounts(t, pool))
}
