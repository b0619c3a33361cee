package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/shard"
)

// fleetParallel is how many shards a fleet command queries at once: few
// enough that 300 shards do not open 300 connections from one shell, many
// enough that they answer in about 300/8 shard round trips.
const fleetParallel = 8

// readCommands are the commands that read, and run on every shard of a
// fleet at once; the others change one shard and need -shard.
var readCommands = map[string]bool{"health": true, "dead list": true, "consumers": true,
	"letters list": true, "gaps list": true, "requests": true, "moves": true}

// producerCommands read a fleet's "shards"; the others its "targets", the
// databases consumers apply records in.
var producerCommands = map[string]bool{"health": true, "dead list": true, "dead replay": true, "dead discard": true, "moves": true}

// databaseList is -database, which a command may repeat to name a fleet.
type databaseList []string

func (d *databaseList) String() string { return strings.Join(*d, " ") }

// Set adds one database.
func (d *databaseList) Set(v string) error {
	*d = append(*d, v)
	return nil
}

// stringList is a flag given once per value, such as -aggregate.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, " ") }

// Set adds one value.
func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// fleetOf is the fleet the command line names, with -fleet FILE or with
// -database repeated, and whether it names one at all.
func fleetOf(o *opts) (shard.Fleet, bool, error) {
	if o.fleetFile != "" {
		if o.set["database"] || o.set["schema"] {
			return shard.Fleet{}, false, usageError("-fleet names the databases and schemas: drop -database and -schema, or -fleet")
		}
		f, err := shard.Load(o.fleetFile)
		return f, true, err
	}
	if len(o.databases) < 2 {
		return shard.Fleet{}, false, nil
	}
	list := make([]shard.Shard, 0, len(o.databases))
	for i, db := range o.databases {
		s := shard.Shard{Name: strconv.Itoa(i + 1), Database: db, Schema: o.schema}
		if cfg, err := pgx.ParseConfig(db); err == nil && cfg.Database != "" {
			s.Name = shardName(strconv.Itoa(i+1) + "-" + cfg.Database)
		}
		list = append(list, s)
	}
	f := shard.Fleet{Shards: list, Targets: list}
	if err := f.Validate(); err != nil {
		return shard.Fleet{}, false, usageError("-database: %v", err)
	}
	return f, true, nil
}

// shardName makes s a valid shard name: characters shard names may not
// hold become '_', and it is cut to 63 bytes.
func shardName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !strings.ContainsRune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-", rune(c)) {
			b[i] = '_'
		}
	}
	return string(b[:min(len(b), 63)])
}

// inFleet runs cmd over the fleet the command line names. A read command
// runs on every shard, or on -shard alone; a command that changes data
// runs on -shard, and is refused without it. done is false when the
// command line names no fleet.
func inFleet(ctx context.Context, cmd string, o *opts, out io.Writer) (done bool, err error) {
	f, ok, err := fleetOf(o)
	if err != nil {
		return true, err
	}
	if !ok {
		return false, nil
	}
	if o.shard == "" {
		switch cmd {
		case "migrate":
			return true, fleetMigrate(ctx, o, f, out)
		case "dashboard":
			return true, fleetDashboard(ctx, o, f, out)
		}
	}
	list, what := f.Targets, "targets"
	switch {
	case producerCommands[cmd]:
		list, what = f.Shards, "shards"
	case cmd == "migrate" || cmd == "dashboard":
		list, what = places(f), "shards and targets"
	}
	if len(list) == 0 {
		return true, withCode(exitUsage, fmt.Errorf("%s reads the fleet's %q, and the fleet names none; add them to the file", cmd, what))
	}
	names := make([]string, 0, len(list))
	for _, s := range list {
		names = append(names, s.Name)
	}
	if o.shard != "" {
		for _, s := range list {
			if s.Name == o.shard {
				o.database, o.schema = s.Database, s.Schema
				return false, nil
			}
		}
		return true, usageError("-shard %q is not one of the fleet's %s: %s", o.shard, what, strings.Join(names, ", "))
	}
	if !readCommands[cmd] {
		return true, usageError("%s changes one shard: with a fleet, name it with -shard NAME (%s: %s)", cmd, what, strings.Join(names, ", "))
	}
	return true, runFleet(ctx, cmd, o, list, out)
}

// shardAnswer is what one shard answered to a read command.
type shardAnswer struct {
	shard string
	err   error
	// value is what the command would write as JSON for this shard alone.
	value any
	// header, rows and caps are its table, when it wrote one.
	header []string
	rows   [][]string
	caps   []int
	// text is what it wrote besides (such as a note that -limit cut the
	// list).
	text bytes.Buffer
}

// table writes the command's table, or keeps it as the shard's answer when
// the command runs in a fleet.
func (e *env) table(header []string, rows [][]string, caps []int) error {
	if e.answer != nil {
		e.answer.header, e.answer.rows, e.answer.caps = header, rows, caps
		return nil
	}
	return table(e.out, header, rows, caps)
}

// writeJSON writes v as the command's JSON answer, or keeps it as the
// shard's answer when the command runs in a fleet.
func (e *env) writeJSON(v any) error {
	if e.answer != nil {
		e.answer.value = v
		return nil
	}
	return writeJSON(e.out, v)
}

// runFleet runs the read command cmd on each shard of list, at most
// fleetParallel at once and each within -shard-timeout, and writes their
// answers in list order: a table with a SHARD column, or JSON with a shard
// field. A shard that fails has a row that says so; the others answer
// all the same, and the command then fails with exit code 1.
func runFleet(ctx context.Context, cmd string, o *opts, list []shard.Shard, out io.Writer) error {
	answers := make([]*shardAnswer, len(list))
	sem := make(chan struct{}, fleetParallel)
	var wg sync.WaitGroup
	for i, s := range list {
		answers[i] = &shardAnswer{shard: s.Name}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				answers[i].err = ctx.Err()
				return
			}
			defer func() { <-sem }()
			answers[i].err = runShard(ctx, cmd, o, s, answers[i])
		}()
	}
	wg.Wait()
	var failed []string
	for _, a := range answers {
		if a.err != nil {
			failed = append(failed, a.shard)
		}
	}
	var total any
	var totalRows [][]string
	if cmd == "consumers" {
		total, totalRows = consumerTotals(answers)
	}
	var err error
	switch {
	case cmd == "health":
		err = fleetHealth(out, o.format, answers)
	case o.format == "json":
		err = fleetJSON(out, answers, total)
	default:
		err = fleetTable(out, answers, totalRows)
	}
	if err != nil {
		return err
	}
	if len(failed) > 0 {
		return withCode(exitError, fmt.Errorf("%d of %d shards did not answer: %s", len(failed), len(list), strings.Join(failed, ", ")))
	}
	return nil
}

// runShard runs cmd on one shard, within -shard-timeout, into a.
func runShard(ctx context.Context, cmd string, o *opts, s shard.Shard, a *shardAnswer) error {
	ctx, cancel := context.WithTimeout(ctx, o.shardTimeout)
	defer cancel()
	cfg, err := pgx.ParseConfig(s.Database)
	if err != nil {
		return fmt.Errorf("shard %s: database is not a valid connection string", s.Name)
	}
	cfg.ConnectTimeout = o.shardTimeout
	// One connection, opened and closed here: a pool would go on dialling
	// in the background after the timeout, past the fleetParallel bound.
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return timedOut(ctx, o.shardTimeout, fmt.Errorf("connect: %w", err))
	}
	defer func() { _ = conn.Close(ctx) }()
	if err := outbox.CheckMigrated(ctx, conn, s.Schema); err != nil {
		return timedOut(ctx, o.shardTimeout, err)
	}
	reads, err := consumer.NewInspector(conn, s.Schema)
	if err != nil {
		return err
	}
	so := *o
	so.database, so.schema = s.Database, s.Schema
	e := &env{db: conn, reads: reads, opts: &so, out: &a.text, cmd: cmd, answer: a}
	return timedOut(ctx, o.shardTimeout, handlers[cmd](ctx, e))
}

// timedOut says that the shard ran out of -shard-timeout when ctx did.
func timedOut(ctx context.Context, d time.Duration, err error) error {
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("no answer within -shard-timeout %s: %w", d, err)
	}
	return err
}

// fleetJSON writes each shard's answer as {"shard", "error" or "result"},
// where result is what the command writes for that shard alone, and the
// fleet's total when there is one.
func fleetJSON(out io.Writer, answers []*shardAnswer, total any) error {
	type shardJSON struct {
		Shard  string `json:"shard"`
		Error  string `json:"error,omitempty"`
		Result any    `json:"result,omitempty"`
		Note   string `json:"note,omitempty"`
	}
	list := make([]shardJSON, 0, len(answers))
	for _, a := range answers {
		j := shardJSON{Shard: a.shard, Result: a.value, Note: strings.TrimSpace(a.text.String())}
		if a.err != nil {
			j.Error, j.Result = a.err.Error(), nil
		}
		list = append(list, j)
	}
	if total != nil {
		return writeJSON(out, map[string]any{"shards": list, "total": total})
	}
	return writeJSON(out, map[string]any{"shards": list})
}

// fleetTable writes the shards' tables as one, under a SHARD column, then
// totalRows; a shard that failed has one row, ERROR, and its error is
// written in full below the table with what the shards wrote besides
// their tables.
func fleetTable(out io.Writer, answers []*shardAnswer, totalRows [][]string) error {
	var header []string
	var caps []int
	for _, a := range answers {
		if a.err == nil && a.header != nil {
			header, caps = append([]string{"SHARD"}, a.header...), append([]int{12}, a.caps...)
			break
		}
	}
	if header == nil {
		header, caps = []string{"SHARD", "ERROR"}, []int{12, 0}
	}
	var rows [][]string
	var notes []string
	for _, a := range answers {
		if a.err != nil {
			row := make([]string, len(header))
			row[0], row[1] = a.shard, "ERROR"
			if len(row) > 2 {
				row[len(row)-1] = a.err.Error()
			}
			rows = append(rows, row)
			notes = append(notes, fmt.Sprintf("shard %s: %s", a.shard, a.err))
			continue
		}
		for _, r := range a.rows {
			rows = append(rows, append([]string{a.shard}, r...))
		}
		for _, line := range strings.Split(strings.TrimSpace(a.text.String()), "\n") {
			if line != "" {
				notes = append(notes, fmt.Sprintf("shard %s: %s", a.shard, line))
			}
		}
	}
	if err := table(out, header, append(rows, totalRows...), caps); err != nil {
		return err
	}
	return writeNotes(out, notes)
}

// fleetHealth writes each shard's health and the fleet's total: the sums
// of undelivered and dead events, and the oldest undelivered age of all.
func fleetHealth(out io.Writer, format string, answers []*shardAnswer) error {
	type shardHealth struct {
		Shard string `json:"shard"`
		Error string `json:"error,omitempty"`
		*healthRow
	}
	var total healthRow
	var notes []string
	list := make([]shardHealth, 0, len(answers))
	rows := make([][]string, 0, len(answers)+1)
	for _, a := range answers {
		h, _ := a.value.(healthRow)
		if a.err != nil {
			list = append(list, shardHealth{Shard: a.shard, Error: a.err.Error()})
			rows = append(rows, []string{a.shard, "ERROR", "", "", a.err.Error()})
			notes = append(notes, fmt.Sprintf("shard %s: %s", a.shard, a.err))
			continue
		}
		list = append(list, shardHealth{Shard: a.shard, healthRow: &h})
		total.Undelivered += h.Undelivered
		total.Dead += h.Dead
		if h.OldestUndeliveredSeconds > total.OldestUndeliveredSeconds {
			total.OldestUndeliveredSeconds, total.OldestUndeliveredError = h.OldestUndeliveredSeconds, h.OldestUndeliveredError
		}
		rows = append(rows, []string{a.shard, strconv.FormatInt(h.Undelivered, 10), age(h.OldestUndeliveredSeconds),
			strconv.FormatInt(h.Dead, 10), h.OldestUndeliveredError})
	}
	if format == "json" {
		return writeJSON(out, map[string]any{"shards": list, "total": total})
	}
	rows = append(rows, []string{"TOTAL", strconv.FormatInt(total.Undelivered, 10), age(total.OldestUndeliveredSeconds),
		strconv.FormatInt(total.Dead, 10), ""})
	if err := table(out, []string{"SHARD", "UNDELIVERED", "OLDEST", "DEAD", "ERROR"}, rows, []int{16, 0, 0, 0, 0}); err != nil {
		return err
	}
	return writeNotes(out, notes)
}

// writeNotes writes what the shards said besides their tables, such as
// their errors in full, one line each.
func writeNotes(out io.Writer, notes []string) error {
	for _, n := range notes {
		if _, err := fmt.Fprintln(out, safe(strings.Join(strings.Fields(n), " "))); err != nil {
			return err
		}
	}
	return nil
}

// consumerTotals adds up each consumer over the shards that answered: its
// letters, parked records and aggregates and keys; its oldest gap, oldest
// key and horizon are the largest, and so is LIVE (a process may beat in
// every target it applies to). They are the JSON "total" and the table's
// TOTAL rows, one per consumer.
func consumerTotals(answers []*shardAnswer) ([]consumerRow, [][]string) {
	var totals []consumerRow
	at := map[string]int{}
	for _, a := range answers {
		rows, _ := a.value.([]consumerRow)
		if a.err != nil {
			continue
		}
		for _, r := range rows {
			i, ok := at[r.Consumer]
			if !ok {
				i = len(totals)
				at[r.Consumer] = i
				totals = append(totals, consumerRow{Consumer: r.Consumer})
			}
			t := &totals[i]
			t.LiveMembers = max(t.LiveMembers, r.LiveMembers)
			t.OpenLetters += r.OpenLetters
			t.ParkedAggregates += r.ParkedAggregates
			t.ParkedRecords += r.ParkedRecords
			t.OldestGapSeconds = max(t.OldestGapSeconds, r.OldestGapSeconds)
			t.ProcessedKeys += r.ProcessedKeys
			t.OldestKeySeconds = max(t.OldestKeySeconds, r.OldestKeySeconds)
			t.KeyHorizonUsed = max(t.KeyHorizonUsed, r.KeyHorizonUsed)
		}
	}
	cells := make([][]string, 0, len(totals))
	for _, t := range consumerCells(totals) {
		cells = append(cells, append([]string{"TOTAL"}, t...))
	}
	return totals, cells
}
