package dashboard

import (
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/deadletter"
)

// filter is a dead-letter filter as the letters page's form holds it.
type filter struct {
	Status, Topic, AggregateType, AggregateID, Reason, Failure string
	// FailedAfter and FailedBefore are as typed: a date, a
	// datetime-local value (UTC) or RFC 3339.
	FailedAfter, FailedBefore string
}

// timeLayouts are the layouts a time filter is read in, the form's
// datetime-local first.
var timeLayouts = []string{"2006-01-02T15:04", "2006-01-02T15:04:05", time.RFC3339, "2006-01-02"}

// maxFieldBytes bounds one field of a filter or form: the longest value a
// filter can match is an aggregate id or an idempotency key (1,024
// bytes); a request stores its filter, so an unbounded one would be
// stored whole.
const maxFieldBytes = outbox.MaxAggregateIDBytes

// checkFilterSize refuses a query or form with a field over maxFieldBytes.
func checkFilterSize(q url.Values) error {
	for k, vs := range q {
		for _, v := range vs {
			if len(v) > maxFieldBytes {
				return fmt.Errorf("dashboard: %s is %d bytes; no field takes more than %d", k, len(v), maxFieldBytes)
			}
		}
	}
	return nil
}

// parseFilter reads a filter from q (a query or a form) for consumer.
// Status defaults to dead; "all" filters none.
func parseFilter(q url.Values, consumer string) (filter, deadletter.ListOpts, error) {
	if err := checkFilterSize(q); err != nil {
		return filter{}, deadletter.ListOpts{}, err
	}
	f := filter{Status: q.Get("status"), Topic: q.Get("topic"), AggregateType: q.Get("aggregate_type"), AggregateID: q.Get("aggregate_id"),
		Reason: q.Get("reason"), Failure: q.Get("failure"), FailedAfter: q.Get("failed_after"), FailedBefore: q.Get("failed_before")}
	if f.Status == "" {
		f.Status = string(deadletter.StatusDead)
	}
	o := deadletter.ListOpts{Consumer: consumer, Topic: f.Topic, AggregateType: f.AggregateType, AggregateID: f.AggregateID,
		Failure: f.Failure}
	var err error
	if o.Reason, err = deadletter.ParseReason(f.Reason); err != nil {
		return f, o, err
	}
	switch deadletter.Status(f.Status) {
	case deadletter.StatusDead, deadletter.StatusReplayed, deadletter.StatusDiscarded:
		o.Status = deadletter.Status(f.Status)
	case "all":
	default:
		return f, o, fmt.Errorf("dashboard: status %q: want dead, replayed, discarded or all", f.Status)
	}
	if o.FailedAfter, err = parseTime("failed_after", f.FailedAfter); err != nil {
		return f, o, err
	}
	if o.FailedBefore, err = parseTime("failed_before", f.FailedBefore); err != nil {
		return f, o, err
	}
	return f, o, nil
}

func parseTime(name, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, l := range timeLayouts {
		if t, err := time.ParseInLocation(l, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("dashboard: %s %q is not a time; write 2026-01-02, 2026-01-02T15:04 (UTC) or RFC 3339", name, s)
}

// values is f as a query, without its empty fields.
func (f filter) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"status": f.Status, "topic": f.Topic, "aggregate_type": f.AggregateType,
		"aggregate_id": f.AggregateID, "reason": f.Reason, "failure": f.Failure, "failed_after": f.FailedAfter, "failed_before": f.FailedBefore} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// empty reports whether f selects every open letter.
func (f filter) empty() bool {
	return f.Topic == "" && f.AggregateType == "" && f.AggregateID == "" && f.Reason == "" && f.Failure == "" &&
		f.FailedAfter == "" && f.FailedBefore == ""
}

// int64Param reads the optional number name of q: 0 when absent.
func int64Param(q url.Values, name string) (int64, error) {
	s := q.Get(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("dashboard: %s %q is not a non-negative whole number", name, s)
	}
	return n, nil
}
