package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/operator"
)

// requestRow is a request as the requests command writes it in JSON.
type requestRow struct {
	ID          int64            `json:"id"`
	Consumer    string           `json:"consumer"`
	Action      operator.Action  `json:"action"`
	LetterID    int64            `json:"letter_id,omitempty"`
	Filter      string           `json:"filter,omitempty"`
	RequestedBy string           `json:"requested_by"`
	RequestedAt time.Time        `json:"requested_at"`
	Status      operator.Status  `json:"status"`
	StartedAt   *time.Time       `json:"started_at,omitempty"`
	FinishedAt  *time.Time       `json:"finished_at,omitempty"`
	Progress    map[string]int64 `json:"progress"`
	Error       string           `json:"error,omitempty"`
}

func requests(ctx context.Context, e *env) error {
	rs, err := e.operator().List(ctx, e.db, &operator.ListOpts{Consumer: e.consumer, Limit: e.limit})
	if err != nil {
		return err
	}
	if e.format == "json" {
		out := make([]requestRow, 0, len(rs))
		for _, r := range rs {
			p := r.Progress
			out = append(out, requestRow{ID: r.ID, Consumer: r.Consumer, Action: r.Action, LetterID: r.LetterID, Filter: filterText(r),
				RequestedBy: r.RequestedBy, RequestedAt: r.RequestedAt, Status: r.Status, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
				Progress: map[string]int64{"matched": p.Matched, "applied": p.Applied, "duplicates": p.Duplicates, "discarded": p.Discarded,
					"failed": p.Failed, "skipped": p.Skipped, "drained": p.Drained}, Error: r.Error})
		}
		return e.writeJSON(out)
	}
	rows := make([][]string, 0, len(rs))
	for _, r := range rs {
		p := r.Progress
		done := strconv.FormatInt(p.Applied+p.Duplicates+p.Discarded, 10) + "/" + strconv.FormatInt(p.Matched, 10)
		rows = append(rows, []string{strconv.FormatInt(r.ID, 10), r.Consumer, string(r.Action), string(r.Status), r.RequestedBy,
			ago(r.RequestedAt), done, strconv.FormatInt(p.Drained, 10), strconv.FormatInt(p.Failed, 10), r.Error})
	}
	return e.table([]string{"ID", "CONSUMER", "ACTION", "STATUS", "BY", "AGE", "DONE", "DRAINED", "FAILED", "ERROR"}, rows,
		[]int{0, 12, 0, 0, 10, 0, 0, 0, 0, 0})
}

// filterText is the filter of a bulk or resolve-gap request, as flags.
func filterText(r *operator.Request) string {
	l := r.Letters
	var parts []string
	for _, f := range []struct{ flag, v string }{{"topic", l.Topic}, {"aggregate-type", l.AggregateType}, {"aggregate-id", l.AggregateID},
		{"reason", string(l.Reason)}, {"failure", l.Failure}} {
		if f.v != "" {
			parts = append(parts, fmt.Sprintf("-%s %q", f.flag, f.v))
		}
	}
	if !l.FailedAfter.IsZero() {
		parts = append(parts, "-since "+l.FailedAfter.UTC().Format(time.RFC3339))
	}
	if !l.FailedBefore.IsZero() {
		parts = append(parts, "-until "+l.FailedBefore.UTC().Format(time.RFC3339))
	}
	return strings.Join(parts, " ")
}

// requestCancel cancels the pending or running request named by its one
// argument.
func requestCancel(ctx context.Context, e *env) error {
	if len(e.args) != 1 {
		return usageError("requests cancel takes one request id")
	}
	id, err := strconv.ParseInt(e.args[0], 10, 64)
	if err != nil {
		return usageError("requests cancel: request id %q is not a number", e.args[0])
	}
	r, err := e.operator().Cancel(operator.WithActor(ctx, e.by), e.pool, id)
	switch {
	case errors.Is(err, outbox.ErrNotFound):
		return withCode(exitNotFound, err)
	case errors.Is(err, operator.ErrFinished):
		return withCode(exitFailed, err)
	case err != nil:
		return err
	}
	fmt.Fprintf(e.out, "request %d cancelled; applied %d, discarded %d before the cancel\n", r.ID, r.Progress.Applied, r.Progress.Discarded)
	return nil
}
