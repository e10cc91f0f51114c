package checkpoint_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/internal/checkpoint"
)

// The cursor's version travels with it: committed by the same fenced write, handed to the
// next claimer, 1 for a cursor written without one; ReleaseIn says whether it released.
func TestCursorVersionTravelsWithCursor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, b := setup(t, &checkpoint.Config{Lease: 10 * time.Second})

	l, err := s.Claim(ctx, "k", "a", 1)
	require.NoError(t, err)
	require.Equal(t, 1, l.CursorVersion, "no cursor committed yet: version 1")

	advance := func(l *checkpoint.Lease, cursor string, opts *checkpoint.AdvanceOpts) error {
		tx, err := s.Begin(ctx, l)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		if err := s.Advance(ctx, tx, l, json.RawMessage(cursor), opts); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	require.NoError(t, advance(l, `{"done":1}`, &checkpoint.AdvanceOpts{CursorVersion: 3, Release: true}))
	require.Equal(t, 3, l.CursorVersion)
	st, err := s.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 3, st.CursorVersion)

	l, err = s.Claim(ctx, "k", "b", 1)
	require.NoError(t, err)
	require.Equal(t, 3, l.CursorVersion, "the claimer learns the committed cursor's version")
	require.JSONEq(t, `{"done":1}`, string(l.Cursor))

	// A writer that says nothing of versions writes version 1.
	require.NoError(t, advance(l, `{"next":2}`, nil))
	st, err = s.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 1, st.CursorVersion)
	require.ErrorContains(t, advance(l, `{}`, &checkpoint.AdvanceOpts{CursorVersion: -2}), "versions start at 1")

	released, err := s.ReleaseIn(ctx, b.pool, l)
	require.NoError(t, err)
	require.True(t, released)
	released, err = s.ReleaseIn(ctx, b.pool, l)
	require.NoError(t, err)
	require.False(t, released, "a lease no longer held is not released twice")
}
