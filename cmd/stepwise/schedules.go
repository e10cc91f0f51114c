package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	sw "github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/schedule"
	"github.com/stepwise-go/stepwise/stepwisetype"
)

func runSchedules(ctx context.Context, c *cli, args []string) error {
	return group(ctx, c, args, "list", []command{
		{"list", "list schedules: spec, zone, policies, watermark, paused (the default)", schedulesList},
		{"pause", "stop a schedule's ticks from deciding slots (runs started go on), audited", func(ctx context.Context, c *cli, args []string) error {
			return schedulesPause(ctx, c, args, true)
		}},
		{"resume", "let a paused schedule's ticks decide slots again (missed slots follow its misfire policy), audited", func(ctx context.Context, c *cli, args []string) error {
			return schedulesPause(ctx, c, args, false)
		}},
		{"slots", "a schedule's newest slots with their batch status, derived from their runs and operations", schedulesSlots},
	})
}

// scheduleRow is a schedule as listed.
type scheduleRow struct {
	Name      string    `json:"name"`
	Spec      string    `json:"spec"`
	Zone      string    `json:"zone"`
	Overlap   string    `json:"overlap"`
	Shards    int       `json:"shards"`
	Watermark time.Time `json:"watermark"`
	Paused    bool      `json:"paused"`
	Version   int       `json:"version"`
	UpdatedAt time.Time `json:"updated_at"`
}

func schedulesList(ctx context.Context, c *cli, args []string) error {
	f := c.newFlags("[--json]", true, true)
	if _, err := f.parse(args, 0, 0, ""); err != nil {
		return err
	}
	pool, client, err := f.operator(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	schedules, err := client.ScheduleList(ctx)
	if err != nil {
		return err
	}
	list := make([]scheduleRow, len(schedules))
	rows := make([][]string, len(schedules))
	for i, s := range schedules {
		list[i] = scheduleRow{Name: s.Name, Spec: s.Spec, Zone: s.Zone, Overlap: s.Overlap, Shards: s.Shards, Watermark: s.Watermark,
			Paused: s.Paused, Version: s.Version, UpdatedAt: s.UpdatedAt}
		state := "active"
		if s.Paused {
			state = "PAUSED"
		}
		rows[i] = []string{s.Name, state, s.Spec, s.Zone, s.Overlap, fmt.Sprint(s.Shards), ts(s.Watermark)}
	}
	return f.print(listing{json: list, none: "no schedules: a schedule registered in your service's code gets its row at its first tick", rows: rows,
		header: []string{"NAME", "STATE", "SPEC", "ZONE", "OVERLAP", "SHARDS", "LAST SLOT DECIDED"}})
}

func schedulesPause(ctx context.Context, c *cli, args []string, pause bool) error {
	f := c.newFlags("NAME --reason TEXT [--actor NAME] [--json]", true, true)
	var a auditFlags
	a.register(f, "why")
	pos, err := f.parse(args, 1, 1, "NAME (the schedule's name, as \"stepwise schedules\" lists it)")
	if err != nil {
		return err
	}
	if err := a.check(c.path); err != nil {
		return err
	}
	pool, client, err := f.operator(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	name := pos[0]
	before, err := client.ScheduleGet(ctx, name)
	if err != nil {
		return notFoundSchedule(err, name)
	}
	if before.Paused == pause {
		what := map[bool]string{true: "paused", false: "active"}[pause]
		if f.json {
			return c.printJSON(map[string]any{"name": name, "paused": pause, "changed": false})
		}
		fmt.Fprintf(c.stdout, "schedule %s is already %s: nothing changed\n", name, what)
		return nil
	}
	if pause {
		err = client.SchedulePause(ctx, name, &sw.SchedulePauseOpts{Actor: a.actor, Reason: a.reason})
	} else {
		err = client.ScheduleResume(ctx, name, &sw.SchedulePauseOpts{Actor: a.actor, Reason: a.reason})
	}
	if err != nil {
		return notFoundSchedule(err, name)
	}
	if f.json {
		return c.printJSON(map[string]any{"name": name, "paused": pause, "changed": true, "actor": a.actor, "reason": a.reason})
	}
	if pause {
		fmt.Fprintf(c.stdout, "schedule %s paused by %s (%q): no slot is decided until \"stepwise schedules resume %s\"; runs already started go on\n", name, a.actor, a.reason, name)
	} else {
		fmt.Fprintf(c.stdout, "schedule %s resumed by %s (%q): slots that fell due meanwhile are decided by its misfire policy at the next tick\n", name, a.actor, a.reason)
	}
	return nil
}

func notFoundSchedule(err error, name string) error {
	if errors.Is(err, stepwisetype.ErrNotFound) {
		return fmt.Errorf("%w: no schedule %q (a schedule gets its row at its first tick); list them with \"stepwise schedules\"", errNotFound, name)
	}
	return err
}

// slotJSON is a slot's report for scripts.
type slotJSON struct {
	Slot           time.Time            `json:"slot"`
	Status         schedule.BatchStatus `json:"status"`
	Decision       string               `json:"decision"`
	Reason         string               `json:"reason,omitempty"`
	Detail         string               `json:"detail,omitempty"`
	DecidedBy      string               `json:"decided_by"`
	Shards         int                  `json:"shards"`
	Runs           map[string]int       `json:"runs"`
	Operations     map[string]int       `json:"operations"`
	NeedsAttention int                  `json:"needs_attention"`
	DecidedAt      time.Time            `json:"decided_at"`
	RunsDoneAt     *time.Time           `json:"runs_done_at,omitempty"`
}

func schedulesSlots(ctx context.Context, c *cli, args []string) error {
	f := c.newFlags("NAME [--limit N] [--json]", true, true)
	limit := f.limit(30, "slots, newest first")
	pos, err := f.parse(args, 1, 1, "NAME (the schedule's name)")
	if err != nil {
		return err
	}
	if err := checkLimit(c.path, *limit); err != nil {
		return err
	}
	pool, client, err := f.operator(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	name := pos[0]
	slots, err := client.SlotList(ctx, name, &sw.SlotListParams{Limit: *limit})
	if err != nil {
		return notFoundSchedule(err, name)
	}
	list := make([]slotJSON, len(slots))
	rows := make([][]string, len(slots))
	for i, s := range slots {
		ops := map[string]int{}
		for st, n := range s.Operations {
			ops[string(st)] = n
		}
		list[i] = slotJSON{Slot: s.Slot, Status: s.Status, Decision: s.Decision, Reason: s.Reason, Detail: s.Detail, DecidedBy: s.DecidedBy,
			Shards: s.Shards, Runs: s.Runs, Operations: ops, NeedsAttention: s.NeedsAttention, DecidedAt: s.DecidedAt, RunsDoneAt: s.RunsDoneAt}
		why := s.Detail
		if why == "" {
			why = s.Reason
		}
		rows[i] = []string{ts(s.Slot), string(s.Status), s.Decision, counts(s.Runs), counts(ops), s.DecidedBy, oneLine(why, 60)}
	}
	return f.print(listing{json: list, none: fmt.Sprintf("schedule %s has decided no slot yet", name), rows: rows,
		header: []string{"SLOT", "STATUS", "DECISION", "RUNS", "OPERATIONS", "DECIDED BY", "WHY"}})
}

func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k, n := range m {
		if n > 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", m[k], k)
	}
	return strings.Join(parts, ", ")
}
