package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/dashboard"
	"github.com/d419a114/outbox/shard"
)

// places are the fleet's shards and then its targets, each database and
// schema once, by its first name.
func places(f shard.Fleet) []shard.Shard {
	seen := map[[2]string]bool{}
	names := map[string]bool{}
	var out []shard.Shard
	for _, s := range append(append([]shard.Shard(nil), f.Shards...), f.Targets...) {
		schema := s.Schema
		if schema == "" {
			schema = outbox.DefaultSchema
		}
		k := [2]string{s.Database, schema}
		if seen[k] || names[s.Name] {
			continue
		}
		seen[k], names[s.Name] = true, true
		out = append(out, s)
	}
	return out
}

// fleetMigrate migrates every shard and target of the fleet, fleetParallel
// at once, and writes a row for each: the versions applied, or its error.
// A shard that fails does not stop the others; the command then exits 1.
func fleetMigrate(ctx context.Context, o *opts, f shard.Fleet, out io.Writer) error {
	list := places(f)
	rows := make([][]string, len(list))
	errs := make([]error, len(list))
	sem := make(chan struct{}, fleetParallel)
	var wg sync.WaitGroup
	for i, s := range list {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			var applied []int
			applied, errs[i] = migrateShard(ctx, s, o.partition)
			done := "up to date"
			if len(applied) > 0 {
				done = "applied " + strings.Trim(fmt.Sprint(applied), "[]")
			}
			if errs[i] != nil {
				done = "ERROR"
			}
			rows[i] = []string{s.Name, s.Schema, done}
		})
	}
	wg.Wait()
	var failed, notes []string
	for i, err := range errs {
		if err != nil {
			failed = append(failed, list[i].Name)
			notes = append(notes, fmt.Sprintf("shard %s: %s", list[i].Name, err))
		}
	}
	if err := table(out, []string{"SHARD", "SCHEMA", "MIGRATIONS"}, rows, []int{12, 40, 0}); err != nil {
		return err
	}
	if err := writeNotes(out, notes); err != nil {
		return err
	}
	if len(failed) > 0 {
		return withCode(exitError, fmt.Errorf("%d of %d shards did not migrate: %s", len(failed), len(list), strings.Join(failed, ", ")))
	}
	return nil
}

// migrateShard migrates one shard's schema on a pool of its own.
func migrateShard(ctx context.Context, s shard.Shard, partition bool) ([]int, error) {
	cfg, err := pgxpool.ParseConfig(s.Database)
	if err != nil {
		return nil, fmt.Errorf("database is not a valid connection string")
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	return outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: s.Schema, PartitionEventsByDay: partition, Logger: slog.New(slog.DiscardHandler)})
}

// fleetDashboard serves the fleet's dashboard (dashboard.NewFleet) over
// its shards and targets, with a pool per database, read-only.
func fleetDashboard(ctx context.Context, o *opts, f shard.Fleet, out io.Writer) error {
	pools := map[string]*pgxpool.Pool{}
	defer func() {
		for _, p := range pools {
			p.Close()
		}
	}()
	var shards []dashboard.FleetShard
	for _, s := range places(f) {
		p, ok := pools[s.Database]
		if !ok {
			cfg, err := pgxpool.ParseConfig(s.Database)
			if err != nil {
				return fmt.Errorf("shard %s: database is not a valid connection string", s.Name)
			}
			cfg.MaxConns = 4
			if p, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
				return fmt.Errorf("shard %s: connect: %w", s.Name, err)
			}
			pools[s.Database] = p
		}
		shards = append(shards, dashboard.FleetShard{Name: s.Name, Pool: p, Schema: s.Schema})
	}
	return serveHandler(ctx, o.listen, fmt.Sprintf("dashboard of a fleet of %d shards", len(shards)), out, func(cfg *dashboard.Config) (http.Handler, error) {
		return dashboard.NewFleet(shards, cfg)
	})
}
