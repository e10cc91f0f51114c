package reconcile

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/outbox"
)

// TestKeyIndexSpreadsADayOfEachKindOfId: a lookup costs the keys of its bucket, so every kind
// of id a ledger holds must spread over the buckets: the ledger's own (OperationID,
// DatedOperationID) and a caller's (EnqueueParams.ID: any uuid). A day of dated ids shares its
// first twelve hex digits, and an index of the keys' first digits put all of them in one
// bucket (a day of a million took 3.15-3.47 s); version 1 and 6 uuids of one host share their
// last twelve. Without a database: the index alone.
func TestKeyIndexSpreadsADayOfEachKindOfId(t *testing.T) {
	t.Parallel()
	day := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	const n = 100_000
	for name, id := range map[string]func(i int) uuid.UUID{
		"OperationID":      func(i int) uuid.UUID { return outbox.OperationID("payout", fmt.Sprintf("settle/%d", i)) },
		"DatedOperationID": func(i int) uuid.UUID { return outbox.DatedOperationID(day, "payout", fmt.Sprintf("settle/%d", i)) },
		"uuid.New":         func(int) uuid.UUID { return uuid.New() },
		"version 1":        func(int) uuid.UUID { return uuid.Must(uuid.NewUUID()) },
		"version 6":        func(int) uuid.UUID { return v6(uuid.Must(uuid.NewUUID())) },
		"version 7":        func(int) uuid.UUID { return uuid.Must(uuid.NewV7()) },
	} {
		entries := make([]StatementEntry, n)
		for i := range entries {
			entries[i].Key = id(i).String()
		}
		idx := newKeyIndex(entries)
		largest := 0
		for p := range 1 << keyBits {
			largest = max(largest, int(idx.starts[p+1]-idx.starts[p]))
		}
		// 100,000 keys in 1,048,576 buckets: about 0.1 a bucket, and the largest of a
		// uniform spread holds 4 or 5.
		require.LessOrEqual(t, largest, 8, "%s: the largest bucket of %d keys", name, n)
		require.Equal(t, int32(n), idx.starts[1<<keyBits], "%s: every key is in a bucket", name)
		for i := 1; i < n; i++ {
			if keyBucket(entries[i-1].Key) == keyBucket(entries[i].Key) {
				require.Less(t, entries[i-1].Key, entries[i].Key, "%s: each bucket sorted by key", name)
			}
		}
	}
}

// v6 is a version 1 uuid's version 6 spelling: its 60-bit time first, most significant bits
// first (uuid.NewV6 repeats ids generated within one clock tick).
func v6(u uuid.UUID) uuid.UUID {
	t := uint64(binary.BigEndian.Uint16(u[6:8])&0x0fff)<<48 | uint64(binary.BigEndian.Uint16(u[4:6]))<<32 | uint64(binary.BigEndian.Uint32(u[0:4]))
	binary.BigEndian.PutUint32(u[0:4], uint32(t>>28))
	binary.BigEndian.PutUint16(u[4:6], uint16(t>>12))
	binary.BigEndian.PutUint16(u[6:8], 0x6000|uint16(t&0x0fff))
	return u
}
