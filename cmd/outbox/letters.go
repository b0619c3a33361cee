package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/operator"
)

// reasonNames is the -reason flag's values, as its help lists them.
func reasonNames() string {
	var names []string
	for _, r := range deadletter.Reasons() {
		names = append(names, string(r))
	}
	return strings.Join(names, ", ")
}

// statusFlag reads the -status flag ("all" was made "" by parse).
func statusFlag(s string) (deadletter.Status, error) {
	switch st := deadletter.Status(s); st {
	case "", deadletter.StatusDead, deadletter.StatusReplayed, deadletter.StatusDiscarded:
		return st, nil
	}
	return "", usageError("-status %q: want dead, replayed, discarded or all", s)
}

// filter is the letters the command line's FILTER flags match.
func (e *env) filter() (deadletter.ListOpts, error) {
	status, err := statusFlag(e.status)
	if err != nil {
		return deadletter.ListOpts{}, err
	}
	reason, err := deadletter.ParseReason(e.reason)
	if err != nil {
		return deadletter.ListOpts{}, usageError("-reason %q: want one of %s", e.reason, reasonNames())
	}
	now := time.Now()
	after, err := when("since", e.since, now)
	if err != nil {
		return deadletter.ListOpts{}, err
	}
	before, err := when("until", e.until, now)
	if err != nil {
		return deadletter.ListOpts{}, err
	}
	return deadletter.ListOpts{Consumer: e.consumer, Topic: e.topic, Status: status,
		AggregateType: e.aggType, AggregateID: e.aggID, Reason: reason, Failure: e.failure,
		FailedAfter: after, FailedBefore: before, AfterID: e.after, Limit: e.limit}, nil
}

func (e *env) operator() *operator.Store { return operator.New(&operator.Config{Schema: e.schema}) }

// letterRow is a letter as the list command writes it in JSON.
type letterRow struct {
	ID            int64             `json:"id"`
	Consumer      string            `json:"consumer"`
	Topic         string            `json:"topic"`
	Partition     int32             `json:"partition"`
	Offset        int64             `json:"offset"`
	AggregateType string            `json:"aggregate_type,omitempty"`
	AggregateID   string            `json:"aggregate_id,omitempty"`
	Seq           int64             `json:"seq,omitempty"`
	Reason        deadletter.Reason `json:"reason"`
	Failure       string            `json:"failure"`
	Error         string            `json:"error"`
	Attempts      int               `json:"attempts"`
	Status        string            `json:"status"`
	FirstFailedAt time.Time         `json:"first_failed_at"`
	LastFailedAt  time.Time         `json:"last_failed_at"`
}

func rowOf(l *deadletter.Letter) letterRow {
	return letterRow{ID: l.ID, Consumer: l.Consumer, Topic: l.Record.Topic, Partition: l.Record.Partition, Offset: l.Record.Offset,
		AggregateType: l.AggregateType, AggregateID: l.AggregateID, Seq: l.Seq, Reason: l.Reason, Failure: l.Failure,
		Error: l.Error, Attempts: l.Attempts, Status: string(l.Status), FirstFailedAt: l.FirstFailedAt, LastFailedAt: l.LastFailedAt}
}

func lettersList(ctx context.Context, e *env) error {
	if e.group {
		return failures(ctx, e)
	}
	f, err := e.filter()
	if err != nil {
		return err
	}
	f.Brief = true
	ls, err := e.reads.Letters(ctx, &f)
	if err != nil {
		return err
	}
	if e.format == "json" {
		rows := make([]letterRow, 0, len(ls))
		for _, l := range ls {
			rows = append(rows, rowOf(l))
		}
		return e.writeJSON(rows)
	}
	rows := make([][]string, 0, len(ls))
	for _, l := range ls {
		agg, seq := "-", "-"
		if l.AggregateID != "" || l.Seq != 0 {
			agg = l.AggregateType + "/" + l.AggregateID
		}
		if l.Seq != 0 {
			seq = strconv.FormatInt(l.Seq, 10)
		}
		rows = append(rows, []string{strconv.FormatInt(l.ID, 10), l.Consumer, agg, seq, string(l.Reason),
			strconv.Itoa(l.Attempts), ago(l.FirstFailedAt), errorTail(l.Error)})
	}
	return e.table([]string{"ID", "CONSUMER", "AGGREGATE", "SEQ", "REASON", "TRIES", "AGE", "ERROR"}, rows,
		[]int{0, 12, 16, 0, 0, 0, 0, 0})
}

// sdkPrefixes are the openings of the SDK's own wrapping of a handler's
// error, which say what the REASON column says already.
var sdkPrefixes = []string{"consumer: ", "handler panicked: "}

// errorTail is a letter's error for a narrow column: without the SDK's
// wrapping (the reason is in its own column), so that the cell starts with
// what the handler said, and a timeout as its bound alone.
func errorTail(s string) string {
	for _, p := range sdkPrefixes {
		s = strings.TrimPrefix(s, p)
	}
	if rest, ok := strings.CutPrefix(s, "handler did not finish within Config.HandlerTimeout ("); ok {
		if bound, cause, ok := strings.Cut(rest, "): "); ok {
			return "over " + bound + ": " + cause
		}
	}
	return s
}

// failureRow is a group of letters as list -group writes it in JSON.
type failureRow struct {
	Failure  string            `json:"failure"`
	Reason   deadletter.Reason `json:"reason"`
	Count    int64             `json:"count"`
	Oldest   time.Time         `json:"oldest"`
	Newest   time.Time         `json:"newest"`
	SampleID int64             `json:"sample_id"`
}

// failures writes the consumer's open letters grouped by failure.
func failures(ctx context.Context, e *env) error {
	if e.consumer == "" {
		return usageError("letters list -group needs -consumer")
	}
	fs, err := e.reads.Failures(ctx, e.consumer, e.limit)
	if err != nil {
		return err
	}
	if e.format == "json" {
		out := make([]failureRow, 0, len(fs))
		for _, f := range fs {
			out = append(out, failureRow{Failure: f.Failure, Reason: f.Reason, Count: f.Count, Oldest: f.Oldest, Newest: f.Newest, SampleID: f.SampleID})
		}
		return e.writeJSON(out)
	}
	rows := make([][]string, 0, len(fs))
	for _, f := range fs {
		rows = append(rows, []string{strconv.FormatInt(f.Count, 10), string(f.Reason), ago(f.Oldest), ago(f.Newest),
			strconv.FormatInt(f.SampleID, 10), f.Failure})
	}
	return e.table([]string{"COUNT", "REASON", "OLDEST", "NEWEST", "SAMPLE", "FAILURE"}, rows, []int{0, 0, 0, 0, 0, 0})
}

// letterDetail is a letter as the show command writes it in JSON: the
// value as text when it is UTF-8, and always as hex.
type letterDetail struct {
	letterRow
	Key       string                `json:"key"`
	Headers   map[string]string     `json:"headers"`
	ValueText *string               `json:"value_text,omitempty"`
	ValueHex  string                `json:"value_hex"`
	Stack     string                `json:"stack,omitempty"`
	ResolveAt *time.Time            `json:"resolved_at,omitempty"`
	History   []deadletter.Delivery `json:"history"`
}

// argLetter reads the letter the command's one argument names.
func (e *env) argLetter(ctx context.Context) (*deadletter.Letter, error) {
	id, err := oneID(e, "dead letter")
	if err != nil {
		return nil, err
	}
	l, err := e.reads.Letter(ctx, id)
	if errors.Is(err, outbox.ErrNotFound) {
		return nil, withCode(exitNotFound, err)
	}
	return l, err
}

func letterShow(ctx context.Context, e *env) error {
	l, err := e.argLetter(ctx)
	if err != nil {
		return err
	}
	d := letterDetail{letterRow: rowOf(l), Key: string(l.Record.Key), Headers: map[string]string{}, ValueHex: hex.EncodeToString(l.Record.Value),
		Stack: l.Stack, ResolveAt: l.ResolvedAt, History: l.History}
	for _, h := range l.Record.Headers {
		d.Headers[h.Key] = printable(h.Value)
	}
	if utf8.Valid(l.Record.Value) {
		v := string(l.Record.Value)
		d.ValueText = &v
	}
	if e.format == "json" {
		return e.writeJSON(d)
	}
	fmt.Fprintf(e.out, "letter     %d (%s)\nconsumer   %s\nrecord     %s/%d@%d key %q\n", l.ID, l.Status, l.Consumer,
		l.Record.Topic, l.Record.Partition, l.Record.Offset, l.Record.Key)
	if l.AggregateID != "" || l.Seq != 0 {
		fmt.Fprintf(e.out, "aggregate  %s/%s seq %d\n", safe(l.AggregateType), safe(l.AggregateID), l.Seq)
	}
	fmt.Fprintf(e.out, "reason     %s\nfailure    %s\nattempts   %d, first %s, last %s\nerror      %s\n", safe(string(l.Reason)), safe(l.Failure), l.Attempts,
		l.FirstFailedAt.UTC().Format(time.RFC3339), l.LastFailedAt.UTC().Format(time.RFC3339), safe(l.Error))
	for _, f := range l.History {
		fmt.Fprintf(e.out, "failed     %s after %d tries: %s\n", f.At.UTC().Format(time.RFC3339), f.Attempts, safe(f.Error))
	}
	for _, h := range l.Record.Headers {
		fmt.Fprintf(e.out, "header     %s: %s\n", safe(h.Key), printable(h.Value))
	}
	fmt.Fprintf(e.out, "value      %d bytes\n%s\n", len(l.Record.Value), printable(l.Record.Value))
	if l.Stack != "" {
		fmt.Fprintf(e.out, "stack\n%s\n", safe(l.Stack))
	}
	return nil
}

// printable is b as text when it is UTF-8 (its control characters
// escaped), else as hex.
func printable(b []byte) string {
	if utf8.Valid(b) {
		return safe(string(b))
	}
	return "hex:" + hex.EncodeToString(b)
}

func lettersAct(ctx context.Context, e *env) error {
	action := operator.Replay
	if e.cmd == "letters discard" {
		action = operator.Discard
	}
	r := &operator.Request{Action: action, Rate: e.rate, RequestedBy: e.by}
	var (
		preview deadletter.Preview
		what    string
	)
	switch len(e.args) {
	case 1:
		l, err := e.argLetter(ctx)
		if err != nil {
			return err
		}
		id := l.ID
		if l.Status != deadletter.StatusDead {
			return withCode(exitFailed, fmt.Errorf("dead letter %d is %s already", id, l.Status))
		}
		r.Consumer, r.LetterID = l.Consumer, id
		what = fmt.Sprintf("letter %d of %s", id, l.Consumer)
		if l.AggregateID != "" {
			preview, err = e.reads.PreviewLetters(ctx, &deadletter.ListOpts{Consumer: l.Consumer, Status: deadletter.StatusDead,
				AggregateType: l.AggregateType, AggregateID: l.AggregateID})
			if err != nil {
				return err
			}
			what += fmt.Sprintf(" (%s/%s seq %d)", l.AggregateType, l.AggregateID, l.Seq)
		}
		preview.Letters = 1
	case 0:
		if e.consumer == "" {
			return usageError("%s needs a dead letter id, or -consumer with a filter or -all", e.cmd)
		}
		f, err := e.filter()
		if err != nil {
			return err
		}
		f.Status, f.AfterID, f.Limit = deadletter.StatusDead, 0, 0
		r.Consumer, r.Letters, r.All = e.consumer, f, e.all
		if preview, err = e.reads.PreviewLetters(ctx, &f); err != nil {
			return err
		}
		what = fmt.Sprintf("%d open letters of %s", preview.Letters, e.consumer)
	default:
		return usageError("%s takes at most one dead letter id", e.cmd)
	}
	fmt.Fprintf(e.out, "%s %s; %d records parked behind their %d aggregates may drain\n", action, what, preview.Parked, preview.Aggregates)
	if e.dryRun {
		return nil
	}
	return e.submit(ctx, r)
}

// submit submits r, prints its id, and with -wait follows it to its end.
func (e *env) submit(ctx context.Context, r *operator.Request) error {
	ops := e.operator()
	id, err := ops.Submit(operator.WithActor(ctx, e.by), e.pool, r)
	if errors.Is(err, operator.ErrInvalid) {
		return withCode(exitUsage, err)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.out, "request %d submitted; consumer %s carries it out while it runs\n", id, r.Consumer)
	if e.wait <= 0 {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, e.wait)
	defer cancel()
	got, err := ops.Wait(wctx, e.pool, id, 0)
	if got != nil {
		printOutcome(e, got)
	}
	switch {
	case err != nil && ctx.Err() == nil && wctx.Err() != nil && (got == nil || !got.Finished()):
		// -wait ran out, before or after the first read of the request.
		return withCode(exitPending, fmt.Errorf("request %d is not done after -wait %s; follow it with outbox requests -consumer %s", id, e.wait, r.Consumer))
	case err != nil:
		return err
	case got.Status == operator.Failed:
		return withCode(exitFailed, fmt.Errorf("request %d failed: %s", id, got.Error))
	case got.Progress.Failed > 0:
		return withCode(exitFailed, fmt.Errorf("request %d: %d of %d letters failed, the first with: %s", id, got.Progress.Failed, got.Progress.Matched, got.Error))
	}
	return nil
}

func printOutcome(e *env, r *operator.Request) {
	p := r.Progress
	fmt.Fprintf(e.out, "request %d %s: matched %d, applied %d, duplicates %d, discarded %d, failed %d, skipped %d, drained %d\n",
		r.ID, r.Status, p.Matched, p.Applied, p.Duplicates, p.Discarded, p.Failed, p.Skipped, p.Drained)
}
