package schedule

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// These tests cover the pure half of a tick: slot computation through a schedule's
// definition, misfire and overlap decisions. The database half is in schedule_test.go.

type planArgs struct {
	Shard int `json:"shard"`
}

func (planArgs) Kind() string { return "plan_test" }

func compile(t testing.TB, sch Schedule[planArgs]) *schedule {
	t.Helper()
	if sch.Name == "" {
		sch.Name = "plan"
	}
	if sch.Misfire == nil {
		sch.Misfire = CatchUpAll{Max: 1_000_000, PerTick: 1_000_000}
	}
	if sch.Overlap == 0 {
		sch.Overlap = OverlapAllowAll
	}
	if sch.Shards == 0 {
		sch.Shards = 1
	}
	if sch.Args == nil {
		sch.Args = func(_ time.Time, shard int) planArgs { return planArgs{Shard: shard} }
	}
	def, err := compileSchedule(sch, 5*time.Second)
	require.NoError(t, err)
	return def
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

func slotsOf(p tickPlan, actions ...slotAction) []time.Time {
	var out []time.Time
	for _, d := range p.decisions {
		for _, a := range actions {
			if d.action == a {
				out = append(out, d.slot)
			}
		}
	}
	return out
}

func times(ss ...string) []time.Time {
	out := make([]time.Time, len(ss))
	for i, s := range ss {
		out[i] = utc(s)
	}
	return out
}

func TestScheduleSlots(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		spec, zone     string
		gap            GapPolicy
		watermark, now string
		want           []time.Time
		wantCount      int // instead of want, for long lists
	}{
		{name: "daily in UTC", spec: "@daily", zone: "UTC",
			watermark: "2026-01-01T00:00:00Z", now: "2026-01-04T00:00:00Z",
			want: times("2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z")},
		{name: "slot at now is due, one second later is not", spec: "0 9 * * *", zone: "UTC",
			watermark: "2026-01-01T09:00:00Z", now: "2026-01-02T09:00:00Z",
			want: times("2026-01-02T09:00:00Z")},
		{name: "spring gap runs after the gap", spec: "30 2 * * *", zone: "America/New_York",
			watermark: "2026-03-07T12:00:00Z", now: "2026-03-09T12:00:00Z",
			want: times("2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z")}, // 03:00 EDT, then 02:30 EDT
		{name: "spring gap skipped under GapSkip", spec: "30 2 * * *", zone: "America/New_York", gap: GapSkip,
			watermark: "2026-03-07T12:00:00Z", now: "2026-03-09T12:00:00Z",
			want: times("2026-03-09T06:30:00Z")},
		{name: "autumn repeat runs once, at its first occurrence", spec: "30 1 * * *", zone: "America/New_York",
			watermark: "2026-10-31T12:00:00Z", now: "2026-11-02T12:00:00Z",
			want: times("2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z")}, // 01:30 EDT, then 01:30 EST
		{name: "hourly follows absolute time on the spring day", spec: "@hourly", zone: "America/New_York",
			watermark: "2026-03-08T05:00:00Z", now: "2026-03-09T04:00:00Z", // local midnight to midnight
			wantCount: 23},
		{name: "hourly follows absolute time on the autumn day", spec: "0 * * * *", zone: "America/New_York",
			watermark: "2026-11-01T04:00:00Z", now: "2026-11-02T05:00:00Z",
			wantCount: 25},
		{name: "CRON_TZ= without a zone", spec: "CRON_TZ=Asia/Tokyo 0 9 * * *",
			watermark: "2026-05-01T00:00:00Z", now: "2026-05-03T00:00:00Z",
			want: times("2026-05-02T00:00:00Z", "2026-05-03T00:00:00Z")},
		{name: "CRON_TZ= overrides Zone", spec: "CRON_TZ=Asia/Tokyo 0 9 * * *", zone: "America/New_York",
			watermark: "2026-05-01T00:00:00Z", now: "2026-05-02T00:00:00Z",
			want: times("2026-05-02T00:00:00Z")},
		{name: "every 15 minutes", spec: "*/15 * * * *", zone: "Europe/Berlin",
			watermark: "2026-06-01T10:00:00Z", now: "2026-06-01T11:00:00Z",
			want: times("2026-06-01T10:15:00Z", "2026-06-01T10:30:00Z", "2026-06-01T10:45:00Z", "2026-06-01T11:00:00Z")},
		{name: "weekdays at 17:00 in Sydney", spec: "0 17 * * mon-fri", zone: "Australia/Sydney",
			watermark: "2026-01-02T00:00:00Z", now: "2026-01-06T12:00:00Z", // Fri 11:00 AEDT to Tue 23:00 AEDT
			want: times("2026-01-02T06:00:00Z", "2026-01-05T06:00:00Z", "2026-01-06T06:00:00Z")},
		{name: "nothing due", spec: "@monthly", zone: "UTC",
			watermark: "2026-01-01T00:00:00Z", now: "2026-01-31T23:59:59Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			def := compile(t, Schedule[planArgs]{Spec: tt.spec, Zone: tt.zone, Gap: tt.gap})
			p := planTick(def, utc(tt.watermark), utc(tt.now), nil, nil, 10_000)
			got := slotsOf(p, actMaterialize)
			if tt.wantCount > 0 {
				require.Len(t, got, tt.wantCount)
			} else {
				require.Equal(t, tt.want, got)
			}
			if len(got) > 0 {
				require.Equal(t, got[len(got)-1], p.watermark)
			} else {
				require.Equal(t, utc(tt.watermark), p.watermark)
			}
		})
	}
}

func TestScheduleMisfirePlans(t *testing.T) {
	t.Parallel()
	t0 := utc("2026-04-01T00:00:00Z")
	now := t0.Add(10 * time.Hour) // 600 per-minute slots missed

	// drain plans ticks from t0 until one decides nothing, and returns every decision.
	drain := func(t *testing.T, def *schedule, maxSlots int) (ticks int, all []slotDecision, perTick []int) {
		t.Helper()
		w := t0
		for ; ticks < 1000; ticks++ {
			p := planTick(def, w, now, nil, nil, maxSlots)
			if len(p.decisions) == 0 {
				return ticks, all, perTick
			}
			all = append(all, p.decisions...)
			perTick = append(perTick, len(slotsOf(p, actMaterialize)))
			w = p.watermark
		}
		t.Fatal("planning never converged")
		return
	}
	count := func(ds []slotDecision, a slotAction, reason string) int {
		n := 0
		for _, d := range ds {
			if d.action == a && d.reason == reason {
				n++
			}
		}
		return n
	}

	t.Run("CatchUpAll runs all at PerTick per tick", func(t *testing.T) {
		t.Parallel()
		def := compile(t, Schedule[planArgs]{Spec: "* * * * *", Zone: "UTC", Misfire: CatchUpAll{Max: 1000, PerTick: 50}})
		ticks, all, perTick := drain(t, def, 10_000)
		require.Equal(t, 12, ticks)
		require.Equal(t, 600, count(all, actMaterialize, ""))
		for _, n := range perTick {
			require.LessOrEqual(t, n, 50)
		}
		require.Equal(t, t0.Add(time.Minute), all[0].slot)
		require.Equal(t, now, all[599].slot)
	})
	t.Run("CatchUpAll skips the oldest beyond Max", func(t *testing.T) {
		t.Parallel()
		def := compile(t, Schedule[planArgs]{Spec: "* * * * *", Zone: "UTC", Misfire: CatchUpAll{Max: 100, PerTick: 1000}})
		p := planTick(def, t0, now, nil, nil, 10_000)
		require.Equal(t, 500, count(p.decisions, actSkip, ReasonCatchUpLimit))
		run := slotsOf(p, actMaterialize)
		require.Len(t, run, 100)
		require.Equal(t, now.Add(-99*time.Minute), run[0], "the newest Max slots run")
		require.Equal(t, now, p.watermark)
	})
	t.Run("RunLatest runs the newest and records the rest", func(t *testing.T) {
		t.Parallel()
		def := compile(t, Schedule[planArgs]{Spec: "* * * * *", Zone: "UTC", Misfire: RunLatest{}})
		p := planTick(def, t0, now, nil, nil, 10_000)
		require.Equal(t, 599, count(p.decisions, actSkip, ReasonMisfireRunLatest))
		require.Equal(t, []time.Time{now}, slotsOf(p, actMaterialize))
		require.Equal(t, now, p.watermark)
	})
	t.Run("RunLatest across a small budget", func(t *testing.T) {
		t.Parallel()
		def := compile(t, Schedule[planArgs]{Spec: "* * * * *", Zone: "UTC", Misfire: RunLatest{}})
		ticks, all, _ := drain(t, def, 100)
		require.Equal(t, 6, ticks) // 500 skips in five ticks, then the last 99 skips and the run
		require.Equal(t, 599, count(all, actSkip, ReasonMisfireRunLatest))
		require.Equal(t, 1, count(all, actMaterialize, ""))
		require.Equal(t, now, all[len(all)-1].slot)
	})
	t.Run("SkipMissed runs none past the deadline", func(t *testing.T) {
		t.Parallel()
		def := compile(t, Schedule[planArgs]{Spec: "* * * * *", Zone: "UTC", Misfire: SkipMissed{StartingDeadline: 5 * time.Minute}})
		p := planTick(def, t0, now, nil, nil, 10_000)
		require.Equal(t, 594, count(p.decisions, actSkip, ReasonMisfireDeadline))
		run := slotsOf(p, actMaterialize)
		require.Len(t, run, 6)
		require.Equal(t, now.Add(-5*time.Minute), run[0], "a slot exactly StartingDeadline old still runs")
	})
	t.Run("an on-time tick decides one slot under every policy", func(t *testing.T) {
		t.Parallel()
		for _, m := range []MisfirePolicy{CatchUpAll{}, RunLatest{}, SkipMissed{StartingDeadline: time.Minute}} {
			def := compile(t, Schedule[planArgs]{Spec: "* * * * *", Zone: "UTC", Misfire: m})
			p := planTick(def, t0, t0.Add(time.Minute+3*time.Second), nil, nil, 10_000)
			require.Equal(t, []time.Time{t0.Add(time.Minute)}, slotsOf(p, actMaterialize), "%T", m)
			require.Len(t, p.decisions, 1, "%T", m)
		}
	})
}

func TestScheduleOverlapPlans(t *testing.T) {
	t.Parallel()
	t0 := utc("2026-04-01T00:00:00Z")
	m1, m2 := t0.Add(time.Minute), t0.Add(2*time.Minute)
	busy := func(s time.Time) openSlot { return openSlot{slot: s} }
	buf := func(s time.Time) openSlot { return openSlot{slot: s, buffered: true} }
	type want struct {
		materialize, buffer, promote, skip, supersede, cancel []time.Time
		reason                                                string
	}
	tests := []struct {
		name      string
		overlap   OverlapPolicy
		watermark time.Time
		now       time.Time
		open      []openSlot
		want      want
	}{
		{"AllowAll starts beside a running slot", OverlapAllowAll, t0, m1, []openSlot{busy(t0)}, want{materialize: []time.Time{m1}}},
		{"Skip records the slot skipped", OverlapSkip, t0, m1, []openSlot{busy(t0)}, want{skip: []time.Time{m1}, reason: ReasonOverlapSkip}},
		{"Skip starts when nothing runs", OverlapSkip, t0, m1, nil, want{materialize: []time.Time{m1}}},
		{"BufferOne buffers the first", OverlapBufferOne, t0, m1, []openSlot{busy(t0)}, want{buffer: []time.Time{m1}}},
		{"BufferOne skips the second", OverlapBufferOne, m1, m2, []openSlot{busy(t0), buf(m1)}, want{skip: []time.Time{m2}, reason: ReasonOverlapBufferFull}},
		{"BufferOne promotes when the runs end", OverlapBufferOne, m1, m1, []openSlot{buf(m1)}, want{promote: []time.Time{m1}}},
		{"BufferAll buffers every one", OverlapBufferAll, m1, m2, []openSlot{busy(t0), buf(m1)}, want{buffer: []time.Time{m2}}},
		{"BufferAll promotes one at a time, in order", OverlapBufferAll, m2, m2, []openSlot{buf(m1), buf(m2)}, want{promote: []time.Time{m1}}},
		{"BufferAll keeps order when a slot is due meanwhile", OverlapBufferAll, m1, m2, []openSlot{buf(m1)}, want{promote: []time.Time{m1}, buffer: []time.Time{m2}}},
		{"CancelOther cancels and waits", OverlapCancelOther, t0, m1, []openSlot{busy(t0)}, want{cancel: []time.Time{t0}, buffer: []time.Time{m1}}},
		{"CancelOther supersedes a waiting slot", OverlapCancelOther, m1, m2, []openSlot{busy(t0), buf(m1)},
			want{cancel: []time.Time{t0}, supersede: []time.Time{m1}, buffer: []time.Time{m2}, reason: ReasonOverlapSuperseded}},
		{"CancelOther starts once the old runs ended", OverlapCancelOther, m1, m1, []openSlot{buf(m1)}, want{promote: []time.Time{m1}}},
		{"CancelOther keeps the newest of a catch-up", OverlapCancelOther, t0, m2, nil,
			want{skip: []time.Time{m1}, materialize: []time.Time{m2}, reason: ReasonOverlapSuperseded}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			def := compile(t, Schedule[planArgs]{Spec: "* * * * *", Zone: "UTC", Overlap: tt.overlap})
			p := planTick(def, tt.watermark, tt.now, tt.open, nil, 10_000)
			require.Equal(t, tt.want.materialize, slotsOf(p, actMaterialize), "materialize")
			require.Equal(t, tt.want.buffer, slotsOf(p, actBuffer), "buffer")
			require.Equal(t, tt.want.promote, slotsOf(p, actPromote), "promote")
			require.Equal(t, tt.want.skip, slotsOf(p, actSkip), "skip")
			require.Equal(t, tt.want.supersede, slotsOf(p, actSupersede), "supersede")
			require.Equal(t, tt.want.cancel, p.cancel, "cancel")
			for _, d := range p.decisions {
				if d.action == actSkip || d.action == actSupersede {
					require.Equal(t, tt.want.reason, d.reason)
					require.NotEmpty(t, d.detail)
				}
			}
		})
	}
}

func TestScheduleRegistrationErrors(t *testing.T) {
	t.Parallel()
	args := func(time.Time, int) planArgs { return planArgs{} }
	ok := Schedule[planArgs]{Name: "settle", Spec: "0 2 * * *", Zone: "UTC", Misfire: RunLatest{}, Overlap: OverlapSkip, Shards: 1, Args: args}
	tests := []struct {
		name   string
		change func(s *Schedule[planArgs])
		want   []string // substrings of the message
	}{
		{"invalid spec", func(s *Schedule[planArgs]) { s.Spec = "61 * * * *" }, []string{`schedule "settle"`, "minute field", "0-59"}},
		{"@every", func(s *Schedule[planArgs]) { s.Spec = "@every 15m" }, []string{`schedule "settle"`, `"*/15 * * * *"`}},
		{"unknown zone", func(s *Schedule[planArgs]) { s.Zone = "Asia/Shangai" }, []string{`schedule "settle"`, `unknown time zone "Asia/Shangai"`}},
		{"zone in the wrong case", func(s *Schedule[planArgs]) { s.Zone = "america/new_york" }, []string{`did you mean "America/New_York"`}},
		{"no zone", func(s *Schedule[planArgs]) { s.Zone = "" }, []string{`schedule "settle"`, "set Zone", "CRON_TZ="}},
		{"Local zone", func(s *Schedule[planArgs]) { s.Zone = "Local" }, []string{`schedule "settle"`, "differs between nodes"}},
		{"zero shards", func(s *Schedule[planArgs]) { s.Shards = 0 }, []string{`schedule "settle"`, "Shards is 0", "set Shards to 1"}},
		{"no misfire", func(s *Schedule[planArgs]) { s.Misfire = nil }, []string{`schedule "settle"`, "Misfire is nil", "CatchUpAll"}},
		{"no overlap", func(s *Schedule[planArgs]) { s.Overlap = 0 }, []string{`schedule "settle"`, "Overlap", "OverlapBufferAll"}},
		{"deadline within a tick", func(s *Schedule[planArgs]) { s.Misfire = SkipMissed{StartingDeadline: time.Second} },
			[]string{`schedule "settle"`, "StartingDeadline", "TickInterval"}},
		{"negative catch-up", func(s *Schedule[planArgs]) { s.Misfire = CatchUpAll{Max: -1} }, []string{"CatchUpAll.Max"}},
		{"no args", func(s *Schedule[planArgs]) { s.Args = nil }, []string{`schedule "settle"`, "Args is nil"}},
		{"name with a slash", func(s *Schedule[planArgs]) { s.Name = "a/b" }, []string{`schedule name "a/b"`, "letters, digits"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := ok
			tt.change(&s)
			_, err := compileSchedule(s, 5*time.Second)
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrInvalid), "%v", err)
			for _, w := range tt.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
	_, err := compileSchedule(ok, 5*time.Second)
	require.NoError(t, err)
	withPrefix := ok
	withPrefix.Zone, withPrefix.Spec = "", "CRON_TZ=Europe/Paris 0 2 * * *"
	def, err := compileSchedule(withPrefix, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "Europe/Paris", def.zone)
}

func TestShardOf(t *testing.T) {
	t.Parallel()
	// Published FNV-1a 64 test vectors, pinned so that ShardOf's hash can never change
	// between versions (items would move between the shards of runs already started).
	for _, v := range []struct {
		in   string
		hash uint64
	}{
		{"", 0xcbf29ce484222325},
		{"a", 0xaf63dc4c8601ec8c},
		{"foobar", 0x85944171f73967e8},
	} {
		for _, n := range []int{1, 2, 7, 8, 1000, 1 << 30} {
			require.Equal(t, int(v.hash%uint64(n)), ShardOf(v.in, n), "ShardOf(%q, %d)", v.in, n)
		}
	}
	// Business keys as the sample uses them; values computed when ShardOf was written;
	// they must never change.
	for _, v := range []struct {
		key  string
		n    int
		want int
	}{
		{"merchant-1", 8, 3},
		{"merchant-1", 16, 11},
		{"merchant-1", 1000, 955},
		{"merchant-42", 8, 2},
		{"merchant-42", 16, 2},
		{"merchant-42", 1000, 914},
		{"acct:DE89370400440532013000", 8, 0},
		{"acct:DE89370400440532013000", 16, 8},
		{"acct:DE89370400440532013000", 1000, 40},
		{"2026-03-08/settle", 8, 4},
		{"2026-03-08/settle", 16, 12},
		{"2026-03-08/settle", 1000, 292},
	} {
		require.Equal(t, v.want, ShardOf(v.key, v.n))
	}
	require.Panics(t, func() { ShardOf("x", 0) })
	// Spread: 10,000 keys over 8 shards stay within 15% of even.
	counts := make([]int, 8)
	for i := range 10_000 {
		counts[ShardOf(fmt.Sprintf("merchant-%d", i), 8)]++
	}
	for shard, c := range counts {
		require.InDelta(t, 1250, c, 190, "shard %d", shard)
	}
}

// TestPlanPassesOverSlotsDecidedByHand: a slot after the watermark that StartSlot decided
// gets no decision from any misfire or overlap policy, and the watermark passes it; while
// its runs are unfinished (in open) the overlap policy counts it.
func TestPlanPassesOverSlotsDecidedByHand(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	now := start.Add(10 * time.Minute)
	hand := start.Add(4 * time.Minute)
	misfires := []MisfirePolicy{CatchUpAll{}, RunLatest{}, SkipMissed{StartingDeadline: 2 * time.Minute}}
	for _, m := range misfires {
		for o := OverlapAllowAll; o <= OverlapCancelOther; o++ {
			def := compile(t, Schedule[planArgs]{Spec: "* * * * *", Zone: "UTC", Misfire: m, Overlap: o})
			for _, open := range [][]openSlot{nil, {{slot: hand}}} {
				p := planTick(def, start, now, open, []time.Time{hand}, 10_000)
				for _, d := range p.decisions {
					require.False(t, d.slot.Equal(hand), "%T %s: slot decided by hand decided again: %+v", m, o, d)
				}
				require.Equal(t, now, p.watermark, "%T %s", m, o)
				if open != nil && o == OverlapSkip {
					require.Empty(t, slotsOf(p, actMaterialize), "%T: OverlapSkip starts nothing beside a slot started by hand", m)
				}
			}
		}
	}
	// RunLatest when the newest slot was started by hand: the older ones are skipped, none runs.
	def := compile(t, Schedule[planArgs]{Spec: "* * * * *", Zone: "UTC", Misfire: RunLatest{}})
	p := planTick(def, start, now, nil, []time.Time{now}, 10_000)
	require.Empty(t, slotsOf(p, actMaterialize))
	require.Len(t, slotsOf(p, actSkip), 9)
	require.Equal(t, now, p.watermark)
}
