package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox/move"
	"github.com/d419a114/outbox/shard"
)

// moveRow is one shard's side of a move as the moves command writes it in
// JSON.
type moveRow struct {
	ID         string     `json:"id"`
	Direction  string     `json:"direction"`
	Peer       string     `json:"peer"`
	State      move.State `json:"state"`
	Aggregates int        `json:"aggregates"`
	StartedAt  time.Time  `json:"started_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
}

// movesList lists the moves recorded on the shard: each move's side of
// it, out (the source) or in (the target).
func movesList(ctx context.Context, e *env) error {
	rs, err := move.List(ctx, e.db, e.schema, e.limit)
	if err != nil {
		return err
	}
	out := make([]moveRow, 0, len(rs))
	rows := make([][]string, 0, len(rs))
	for _, r := range rs {
		dir, peer := "in", "from "+r.Peer
		if r.Out {
			dir, peer = "out", "to "+r.Peer
		}
		out = append(out, moveRow{ID: r.ID, Direction: dir, Peer: r.Peer, State: r.State, Aggregates: r.Aggregates, StartedAt: r.StartedAt, UpdatedAt: r.UpdatedAt})
		rows = append(rows, []string{r.ID, dir, peer, string(r.State), strconv.Itoa(r.Aggregates), ago(r.StartedAt), ago(r.UpdatedAt)})
	}
	if e.format == "json" {
		return e.writeJSON(out)
	}
	return e.table([]string{"ID", "DIR", "PEER", "STATE", "AGGREGATES", "STARTED", "UPDATED"}, rows, []int{36, 0, 40, 0, 0, 0, 0})
}

// moveCommand runs move start, move resume and move status, which take
// two shards of a fleet (-from and -to) rather than one database.
func moveCommand(ctx context.Context, cmd string, o *opts, out io.Writer) error {
	f, ok, err := fleetOf(o)
	if err != nil {
		return err
	}
	if !ok {
		return usageError("%s: name the shards with -fleet FILE (or -database repeated), and the two of the move with -from and -to", cmd)
	}
	from, err := shardNamed(f, "-from", o.from)
	if err != nil {
		return err
	}
	to, err := shardNamed(f, "-to", o.to)
	if err != nil {
		return err
	}
	if from.Name == to.Name {
		return usageError("%s: -from and -to name the same shard %q", cmd, from.Name)
	}
	id := o.moveID
	if cmd != "move start" {
		if len(o.args) != 1 {
			return usageError("%s takes one move id", cmd)
		}
		id = o.args[0]
	} else if len(o.args) > 0 {
		return usageError("move start takes no arguments: name the aggregates with -aggregate TYPE/ID or -aggregates FILE")
	}
	src, err := endpoint(ctx, from, o.shardTimeout)
	if err != nil {
		return err
	}
	defer src.DB.(*pgxpool.Pool).Close()
	dst, err := endpoint(ctx, to, o.shardTimeout)
	if err != nil {
		return err
	}
	defer dst.DB.(*pgxpool.Pool).Close()
	cfg := &move.Config{ID: id, AllowNew: o.allowNew, Logger: slog.New(slog.NewTextHandler(out, nil))}
	switch cmd {
	case "move status":
		st, err := move.Get(ctx, id, src, dst)
		if err != nil {
			return moveError(err)
		}
		if o.format == "json" {
			return writeJSON(out, st)
		}
		_, err = fmt.Fprintln(out, safe(st.String()))
		return err
	case "move resume":
		err = move.Resume(ctx, id, src, dst, cfg)
	default:
		aggs, aerr := aggregatesOf(o)
		if aerr != nil {
			return aerr
		}
		id, err = move.Run(ctx, src, dst, aggs, cfg)
	}
	if err != nil {
		if ctx.Err() != nil && id != "" {
			return fmt.Errorf("move %s interrupted; it holds where it got to: finish it with outbox move resume %s -from %s -to %s (and the same -fleet or -database)", id, id, from.Name, to.Name)
		}
		return moveError(err)
	}
	st, err := move.Get(ctx, id, src, dst)
	if err != nil {
		return moveError(err)
	}
	_, err = fmt.Fprintln(out, safe(st.String()))
	return err
}

// moveError gives a move's error its exit code: not found, or failed
// (blocked by dead events, or the aggregates' state refuses the move).
func moveError(err error) error {
	var conflict *move.ConflictError
	switch {
	case errors.Is(err, move.ErrUnknownMove):
		return withCode(exitNotFound, err)
	case errors.Is(err, move.ErrBlocked), errors.Is(err, move.ErrRolledBack), errors.As(err, &conflict):
		return withCode(exitFailed, err)
	}
	return err
}

// shardNamed is the shard of f's shards named by flag.
func shardNamed(f shard.Fleet, flag, name string) (shard.Shard, error) {
	names := make([]string, 0, len(f.Shards))
	for _, s := range f.Shards {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	if name == "" {
		return shard.Shard{}, usageError("%s NAME: one of the fleet's shards: %s", flag, strings.Join(names, ", "))
	}
	return shard.Shard{}, usageError("%s %q is not one of the fleet's shards: %s", flag, name, strings.Join(names, ", "))
}

// endpoint connects to s, within timeout.
func endpoint(ctx context.Context, s shard.Shard, timeout time.Duration) (move.Endpoint, error) {
	pool, err := pgxpool.New(ctx, s.Database)
	if err != nil {
		return move.Endpoint{}, fmt.Errorf("shard %q: connect: %w", s.Name, err)
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return move.Endpoint{}, fmt.Errorf("shard %q: connect: %w", s.Name, err)
	}
	return move.Endpoint{Shard: s, DB: pool}, nil
}

// maxMoveAggregates bounds the aggregates of one move from the command
// line.
const maxMoveAggregates = 100_000

// aggregatesOf are the aggregates -aggregate and -aggregates FILE name,
// each TYPE/ID (the id may hold slashes; the type may not).
func aggregatesOf(o *opts) ([]move.Aggregate, error) {
	lines := append([]string(nil), o.aggregates...)
	if o.aggregatesFile != "" {
		f, err := os.Open(o.aggregatesFile)
		if err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("-aggregates: %w", err))
		}
		defer func() { _ = f.Close() }()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
				lines = append(lines, line)
			}
			if len(lines) > maxMoveAggregates {
				return nil, usageError("-aggregates %s: more than %d aggregates; split the move", o.aggregatesFile, maxMoveAggregates)
			}
		}
		if err := sc.Err(); err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("-aggregates %s: %w", o.aggregatesFile, err))
		}
	}
	if len(lines) == 0 {
		return nil, usageError("move start: name the aggregates with -aggregate TYPE/ID (repeated) or -aggregates FILE (one TYPE/ID per line)")
	}
	out := make([]move.Aggregate, 0, len(lines))
	for _, l := range lines {
		typ, id, ok := strings.Cut(l, "/")
		if !ok || typ == "" || id == "" {
			return nil, usageError("aggregate %q: want TYPE/ID, such as order/42", safe(l))
		}
		out = append(out, move.Aggregate{Type: typ, ID: id})
	}
	return out, nil
}
