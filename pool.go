package stepwise

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
)

// poolNeeds is the number of connections a process with River config rc (Stepwise's queues
// installed) and config cfg needs at least (need), and what lets it run without waiting on
// the pool (want). Step lease renewals are not counted: they run on the checkpoint store's
// own connection, outside the pool.
//
// need: every River worker may hold a connection at once (a step its transaction's; a kind's
// dispatcher, in its queue's worker slots, its claim and its recorder), plus two for River
// itself (its notifier's LISTEN connection, the producers' fetches and completions) and one
// for the maintenance loop. Guards against: pgxpool's default MaxConns (max(4, NumCPU))
// holding every connection in step transactions while a dispatcher waits for one to record
// the answers of sends already made (their leases lapse: UNKNOWN_EXTERNAL), and while
// maintenance waits to take over the runs of a dead worker.
//
// want: a second connection per worker (a step's cancel watch and checks beside its
// transaction), a lease renewer and a heartbeat per outbox kind, three for River (leader
// election too) and one per maintenance pass that may run at once (a reconcile pass makes its
// next claim beside its recording transaction when a second connection is free; without one,
// the claim waits for the recording to commit).
func poolNeeds(rc *river.Config, cfg *Config, passes int) (need, want, workers int) {
	for _, qc := range rc.Queues {
		workers += qc.MaxWorkers
	}
	need = workers + 2 + 1
	want = 2*workers + 2*len(cfg.Kinds) + 3 + passes
	return need, want, workers
}

// checkPoolSize refuses a pool too small for the config and warns about one that is tight.
func checkPoolSize(pool *pgxpool.Pool, rc *river.Config, cfg *Config, passes int, logger *slog.Logger) error {
	have := int(pool.Config().MaxConns)
	need, want, workers := poolNeeds(rc, cfg, passes)
	queues := make([]string, 0, len(rc.Queues))
	for _, name := range slices.Sorted(maps.Keys(rc.Queues)) {
		queues = append(queues, fmt.Sprintf("%s=%d", name, rc.Queues[name].MaxWorkers))
	}
	if have < need {
		return fmt.Errorf("stepwise.NewClient: the pool allows %d connections and this config needs at least %d "+
			"(%d River workers [%s], 2 for River, 1 for maintenance), or recording outcomes and takeovers wait behind "+
			"step transactions; set pool_max_conns=%d in the database URL (or pgxpool.Config.MaxConns), "+
			"or lower the queues' MaxWorkers", have, need, workers, strings.Join(queues, " "), want)
	}
	if have < want {
		logger.Warn("stepwise: the pool is tight for this config: steps and sends may wait for a connection; "+
			"set pool_max_conns in the database URL (or pgxpool.Config.MaxConns)",
			slog.Int("max_conns", have), slog.Int("need", need), slog.Int("want", want), slog.String("queues", strings.Join(queues, " ")))
	}
	return nil
}
