package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/internal/pgbouncer"
)

// poolConfig is the configuration of a pool of the scenario's: to the
// server, or through the pooler with pgx's exec mode, which transaction
// pooling needs (no statement cache).
func (s *scenario) poolConfig() *pgxpool.Config {
	s.t.Helper()
	url := s.db.Server.URL
	if s.pooler != nil {
		url = s.pooler.URL
	}
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(s.t, err)
	if s.pooler != nil {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	return cfg
}

// routeThrough puts PgBouncer in mode in front of the scenario's server
// and sends the writers, the relays' pools and the consumer members' pools
// through it from now on. Session connections (RelayConfig.SessionConfig,
// consumer.Config.SessionConfig) are the caller's to point at the server.
func (s *scenario) routeThrough(mode pgbouncer.Mode) {
	s.t.Helper()
	s.pooler = pgbouncer.Start(s.t, s.db.Server.URL, mode, &pgbouncer.Opts{PoolSize: 20})
	cfg := s.poolConfig()
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(s.t, err)
	s.t.Cleanup(pool.Close)
	s.writePool = pool
}

// directConfig is a connection config straight to the scenario's server.
func (s *scenario) directConfig() *pgx.ConnConfig {
	s.t.Helper()
	cfg, err := pgx.ParseConfig(s.db.Server.URL)
	require.NoError(s.t, err)
	return cfg
}

// TestScenarioThroughPgBouncer runs the pipeline through PgBouncer in
// transaction and in session mode: 4 writers and the consumer member
// through the pooler in pgx's exec mode, 2 relays with their pools through
// it and their SessionConfig straight to the server, restarted four times
// (stopped, or their sessions killed) while the writers write. Every
// committed event must be applied once, each aggregate in order.
func TestScenarioThroughPgBouncer(t *testing.T) {
	for _, mode := range []pgbouncer.Mode{pgbouncer.Transaction, pgbouncer.Session} {
		t.Run(string(mode), func(t *testing.T) {
			rng := scenarioRand(t)
			s := newScenario(t, rng, broker(t), 4)
			s.routeThrough(mode)
			g := s.newGroup(consumer.Config{SessionConfig: s.directConfig()})
			g.start()
			stopWriters := s.startWriters(writeLoad{Writers: 4, Aggregates: 50, MaxPerTx: 3, Rollback: 0.1, MaxPause: 5 * time.Millisecond, Limit: 3000})

			cfg := scenarioRelayConfig()
			cfg.SessionConfig = s.directConfig()
			started := 0
			start := func() *relay {
				started++
				return s.startRelay(fmt.Sprintf("r%d", started), cfg, nil)
			}
			relays := []*relay{start(), start()}
			var log []string
			for step := range 4 {
				i := rng.IntN(len(relays))
				r := relays[i]
				if rng.IntN(2) == 0 {
					r.stop()
					log = append(log, "stop "+r.name)
				} else {
					n := s.terminate(r.app)
					r.stop()
					log = append(log, fmt.Sprintf("kill %s (%d sessions)", r.name, n))
				}
				relays[i] = start()
				log = append(log, "start "+relays[i].name)
				g.waitApplied(g.applied()+300+rng.IntN(200), 60*time.Second, fmt.Sprintf("step %d (%v)", step, log))
			}
			t.Logf("schedule: %v", log)
			stopWriters()
			g.drain(90 * time.Second)
			for _, r := range relays {
				r.stop()
			}
			rep := s.check()
			g.settled()
			require.Greater(t, rep.Committed, 1000, "too little traffic to say anything")
		})
	}
}
