// Command outbox applies the SDK's migrations and helps operate the
// outbox from a shell.
//
//	outbox migrate [-schema outbox] [-partition-by-day]
//	outbox sql                       print the migrations, in order
//	outbox health  [-schema outbox]
//	outbox consumers [-schema outbox] [-o table|json]   what each consumer set aside and keeps
//	outbox dead list    [-schema outbox] [-status dead] [-aggregate-type T] [-aggregate-id ID]
//	outbox dead replay  [-schema outbox] ID
//	outbox dead discard [-schema outbox] ID
//
// The database comes from -database or DATABASE_URL.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/producer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "outbox:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  outbox migrate [-schema outbox] [-partition-by-day]
  outbox sql
  outbox health [-schema outbox]
  outbox consumers [-schema outbox] [-o table|json]
  outbox dead list [-schema outbox] [-status dead] [-aggregate-type T] [-aggregate-id ID]
  outbox dead replay [-schema outbox] ID
  outbox dead discard [-schema outbox] ID
The database comes from -database or DATABASE_URL.`

var errUsage = errors.New(usage) //nolint:staticcheck // printed to the user as it is: sentences and lines

// run executes one command line; it is main without the process around it.
func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errUsage
	}
	cmd, args := args[0], args[1:]
	if cmd == "dead" {
		if len(args) == 0 {
			return errUsage
		}
		cmd, args = "dead "+args[0], args[1:]
	}
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	database := fs.String("database", os.Getenv("DATABASE_URL"), "PostgreSQL connection string")
	schema := fs.String("schema", outbox.DefaultSchema, "schema of the outbox tables")
	partition := fs.Bool("partition-by-day", false, "migrate: create the events table partitioned by day")
	status := fs.String("status", "dead", "dead list: dead, replayed, discarded or all")
	aggType := fs.String("aggregate-type", "", "dead list: only this aggregate type")
	aggID := fs.String("aggregate-id", "", "dead list: only this aggregate id")
	format := fs.String("o", "table", "consumers: table or json")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s: %w\n%s", cmd, err, usage)
	}

	if cmd == "sql" {
		list, err := outbox.MigrationList()
		if err != nil {
			return err
		}
		for _, m := range list {
			fmt.Fprintf(out, "-- %s\n%s\n", m.Name, m.SQL)
		}
		return nil
	}
	if *database == "" {
		return errors.New("no database: set DATABASE_URL or pass -database")
	}
	pool, err := pgxpool.New(ctx, *database)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()

	if *format != "table" && *format != "json" {
		return fmt.Errorf("%s: -o %q: want table or json\n%s", cmd, *format, usage)
	}

	switch cmd {
	case "consumers":
		return consumers(ctx, pool, *schema, *format, out)
	case "migrate":
		applied, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: *schema, PartitionEventsByDay: *partition, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		if len(applied) == 0 {
			fmt.Fprintf(out, "schema %s is up to date\n", *schema)
		}
		for _, v := range applied {
			fmt.Fprintf(out, "applied version %d to schema %s\n", v, *schema)
		}
		return nil
	case "health":
		h, err := producer.ReadHealth(ctx, pool, *schema)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "undelivered %d\noldest_undelivered %s\ndead %d\n", h.Undelivered, h.OldestUndelivered.Round(time.Millisecond), h.Dead)
		return nil
	case "dead list":
		if *status == "all" {
			*status = ""
		}
		list, err := producer.NewDeadEvents(&producer.DeadEventsConfig{Schema: *schema}).List(ctx, pool,
			&producer.ListOpts{Status: producer.Status(*status), AggregateType: *aggType, AggregateID: *aggID, Limit: 1000})
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tAGGREGATE\tSEQ\tTYPE\tSTATUS\tATTEMPTS\tDIED\tLAST ERROR")
		for _, d := range list {
			fmt.Fprintf(tw, "%d\t%s/%s\t%d\t%s\t%s\t%d\t%s\t%s\n", d.ID, d.AggregateType, d.AggregateID, d.Seq, d.EventType, d.Status, d.Attempts, d.DiedAt.UTC().Format(time.RFC3339), d.LastError)
		}
		return tw.Flush()
	case "dead replay", "dead discard":
		if fs.NArg() != 1 {
			return fmt.Errorf("%s needs one dead event id\n%s", cmd, usage)
		}
		id, err := strconv.ParseInt(fs.Arg(0), 10, 64)
		if err != nil {
			return fmt.Errorf("%s: id %q is not a number", cmd, fs.Arg(0))
		}
		dead := producer.NewDeadEvents(&producer.DeadEventsConfig{Schema: *schema})
		if cmd == "dead replay" {
			err = dead.Replay(ctx, pool, id)
		} else {
			err = dead.Discard(ctx, pool, id)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s: done for dead event %d\n", cmd, id)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}
