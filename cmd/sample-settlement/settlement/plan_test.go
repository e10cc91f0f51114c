package settlement_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
)

func TestPlanSlots(t *testing.T) {
	t.Parallel()
	tests := []struct {
		spec, zone, date string
		wantSlot         string // RFC 3339, UTC
	}{
		{"0 1 * * *", "UTC", "2026-03-01", "2026-03-02T01:00:00Z"},
		{"0 1 * * *", "UTC", "2026-12-31", "2027-01-01T01:00:00Z"},
		{"30 2 * * *", "America/New_York", "2026-03-06", "2026-03-07T07:30:00Z"},
		// 02:30 does not exist in New York on 2026-03-08: the slot is right after the gap.
		{"30 2 * * *", "America/New_York", "2026-03-07", "2026-03-08T07:00:00Z"},
		// 01:30 happens twice on 2026-11-01: the first one.
		{"30 1 * * *", "America/New_York", "2026-10-31", "2026-11-01T05:30:00Z"},
		{"0 0 * * *", "Asia/Tokyo", "2026-03-01", "2026-03-01T15:00:00Z"},
	}
	for _, tt := range tests {
		plan, err := settlement.Plan{Spec: tt.spec, Zone: tt.zone, Shards: 3}.Compile()
		require.NoError(t, err)
		date, err := settlement.ParseDate(tt.date)
		require.NoError(t, err)
		slot, err := plan.Slot(date)
		require.NoError(t, err)
		require.Equal(t, tt.wantSlot, slot.Format(time.RFC3339), "%s in %s, date %s", tt.spec, tt.zone, tt.date)
		require.Equal(t, tt.date, plan.DateOf(slot).Format(time.DateOnly))
		keys, err := plan.RunKeys(date)
		require.NoError(t, err)
		require.Equal(t, []string{"settle/" + tt.wantSlot + "/0", "settle/" + tt.wantSlot + "/1", "settle/" + tt.wantSlot + "/2"}, keys)
		require.Equal(t, settlement.SettleArgs{Date: tt.date, Shard: 2, Shards: 3}, plan.Args(slot, 2))
	}
}

func TestPlanRejects(t *testing.T) {
	t.Parallel()
	for _, p := range []settlement.Plan{
		{Spec: "0 1,13 * * *"}, // two slots a day would settle a date twice
		{Spec: "0 * * * *"},    // hourly
		{Spec: "0 1 * * 1"},    // weekly: most dates never settled
		{Spec: "0 1 * * *", Zone: "Mars/Olympus"},
		{Spec: "61 1 * * *"},
		{Shards: -1},
	} {
		_, err := p.Compile()
		require.Error(t, err, "%+v", p)
	}
}

func TestParseDate(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"2026-13-01", "2026-02-30", "01/03/2026", "2026-3-1", ""} {
		_, err := settlement.ParseDate(bad)
		require.ErrorIs(t, err, settlement.ErrInvalidDate, bad)
		require.ErrorContains(t, err, "want YYYY-MM-DD", bad)
	}
	d, err := settlement.ParseDate("2026-03-01")
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), d)
}

func TestFormatMoney(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		minor int64
		cur   string
		want  string
	}{
		{123456, "EUR", "1,234.56 EUR"},
		{5, "USD", "0.05 USD"},
		{-1999, "GBP", "-19.99 GBP"},
		{48612209, "JPY", "48,612,209 JPY"},
		{1000, "KWD", "1.000 KWD"},
	} {
		require.Equal(t, tt.want, settlement.FormatMoney(tt.minor, tt.cur))
	}
}
