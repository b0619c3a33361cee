package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"strconv"
	"time"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/operator"
	"github.com/d419a114/outbox/producer"
)

// printSQL prints the numbered migrations, in order: their names start
// with four digits, so their lexical order is their order.
func printSQL(out io.Writer) error {
	files := outbox.Migrations()
	names, err := fs.Glob(files, "[0-9][0-9][0-9][0-9]_*.sql")
	if err != nil {
		return err
	}
	for _, name := range names {
		body, err := fs.ReadFile(files, name)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "-- %s\n%s\n", name, body)
	}
	return nil
}

func migrate(ctx context.Context, e *env) error {
	applied, err := outbox.Migrate(ctx, e.pool, &outbox.MigrateConfig{Schema: e.schema, PartitionEventsByDay: e.partition, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		fmt.Fprintf(e.out, "schema %s is up to date\n", e.schema)
	}
	for _, v := range applied {
		fmt.Fprintf(e.out, "applied version %d to schema %s\n", v, e.schema)
	}
	return nil
}

// healthRow is a producer's health as the health command writes it in
// JSON.
type healthRow struct {
	Undelivered              int64   `json:"undelivered"`
	OldestUndeliveredSeconds float64 `json:"oldest_undelivered_seconds"`
	Dead                     int64   `json:"dead"`
	OldestUndeliveredError   string  `json:"oldest_undelivered_error"`
}

func health(ctx context.Context, e *env) error {
	in, err := producer.NewInspector(e.db, e.schema)
	if err != nil {
		return err
	}
	h, err := in.Health(ctx)
	if err != nil {
		return err
	}
	if e.format == "json" || e.answer != nil {
		return e.writeJSON(healthRow{Undelivered: h.Undelivered, OldestUndeliveredSeconds: h.OldestUndelivered.Seconds(),
			Dead: h.Dead, OldestUndeliveredError: h.OldestUndeliveredError})
	}
	fmt.Fprintf(e.out, "undelivered %d\noldest_undelivered %s\ndead %d\n", h.Undelivered, h.OldestUndelivered.Round(time.Millisecond), h.Dead)
	if h.OldestUndeliveredError != "" {
		fmt.Fprintf(e.out, "oldest_undelivered_error %s\n", h.OldestUndeliveredError)
	}
	return nil
}

func deadList(ctx context.Context, e *env) error {
	status, err := statusFlag(e.status)
	if err != nil {
		return err
	}
	in, err := producer.NewInspector(e.db, e.schema)
	if err != nil {
		return err
	}
	list, err := in.DeadEvents(ctx, &deadletter.ListOpts{Status: status, AggregateType: e.aggType, AggregateID: e.aggID, Limit: e.limit, Brief: true})
	if err != nil {
		return err
	}
	if e.format == "json" {
		return e.writeJSON(list)
	}
	rows := make([][]string, 0, len(list))
	for _, d := range list {
		rows = append(rows, []string{strconv.FormatInt(d.ID, 10), d.AggregateType + "/" + d.AggregateID, strconv.FormatInt(d.Seq, 10), d.EventType, string(d.Status),
			strconv.Itoa(d.Attempts), ago(d.LastFailedAt), d.Error})
	}
	return e.table([]string{"ID", "AGGREGATE", "SEQ", "TYPE", "STATUS", "TRIES", "AGE", "LAST ERROR"}, rows,
		[]int{0, 16, 0, 12, 0, 0, 0, 0})
}

func deadResolve(ctx context.Context, e *env) error {
	id, err := oneID(e, "dead event")
	if err != nil {
		return err
	}
	dead, err := producer.NewDeadEvents(&producer.DeadEventsConfig{Schema: e.schema})
	if err != nil {
		return err
	}
	entry := &operator.Entry{Actor: e.by, Action: operator.ReplayEvent, Outcome: operator.OutcomeReplayed, Detail: fmt.Sprintf("dead event %d", id)}
	if e.cmd == "dead replay" {
		err = dead.Replay(ctx, e.pool, id)
	} else {
		entry.Action, entry.Outcome = operator.DiscardEvent, operator.OutcomeDiscarded
		err = dead.Discard(ctx, e.pool, id)
	}
	if err != nil {
		entry.Outcome, entry.Detail = operator.OutcomeFailed, entry.Detail+": "+err.Error()
	}
	if aerr := e.operator().Record(ctx, e.pool, entry); aerr != nil {
		return errors.Join(err, aerr)
	}
	if errors.Is(err, outbox.ErrNotFound) {
		return withCode(exitNotFound, err)
	}
	if errors.Is(err, deadletter.ErrResolved) {
		return withCode(exitFailed, err)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.out, "%s: done for dead event %d\n", e.cmd, id)
	return nil
}

// oneID reads the command's one argument, the id of a what.
func oneID(e *env, what string) (int64, error) {
	if len(e.args) != 1 {
		return 0, usageError("%s needs one %s id", e.cmd, what)
	}
	id, err := strconv.ParseInt(e.args[0], 10, 64)
	if err != nil || id <= 0 {
		return 0, usageError("%s: %s id %q is not a positive number", e.cmd, what, e.args[0])
	}
	return id, nil
}
