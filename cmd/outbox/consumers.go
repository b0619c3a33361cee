package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"
)

// consumerRow is one consumer of the consumers command, as JSON.
type consumerRow struct {
	Consumer string `json:"consumer"`
	// LiveMembers counts the processes running a Consumer of it now.
	LiveMembers      int     `json:"live_members"`
	OpenLetters      int64   `json:"open_dead_letters"`
	ParkedAggregates int64   `json:"parked_aggregates"`
	ParkedRecords    int64   `json:"parked_records"`
	OldestGapSeconds float64 `json:"oldest_gap_seconds"`
	ProcessedKeys    int64   `json:"processed_keys"`
	OldestKeySeconds float64 `json:"oldest_key_seconds"`
	// KeyHorizonUsed is the oldest key's age over -key-retention: near 1,
	// the consumer prunes keys as old as the records a topic may still
	// redeliver.
	KeyHorizonUsed float64 `json:"key_horizon_used"`
}

// consumers prints, for each consumer found in schema, what it has set
// aside and what it keeps, with the oldest key's age as a share of
// -key-retention (HORIZON): a table that fits 80 columns, or JSON.
func consumers(ctx context.Context, e *env) error {
	names, err := e.reads.Consumers(ctx)
	if err != nil {
		return err
	}
	rows := make([]consumerRow, 0, len(names))
	for _, n := range names {
		h, err := e.reads.Health(ctx, n)
		if err != nil {
			return err
		}
		r := consumerRow{Consumer: n, ParkedAggregates: h.ParkedAggregates, ParkedRecords: h.ParkedRecords,
			OldestGapSeconds: h.OldestGap.Seconds(), ProcessedKeys: h.ProcessedKeys, OldestKeySeconds: h.OldestKey.Seconds(),
			KeyHorizonUsed: h.OldestKey.Seconds() / e.keyRetention.Seconds()}
		for _, l := range h.Letters {
			r.OpenLetters += l.Count
		}
		ms, err := e.reads.Members(ctx, n)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if m.Live {
				r.LiveMembers++
			}
		}
		rows = append(rows, r)
	}
	if e.answer != nil {
		e.answer.value = rows // for the fleet's total, in either format
	}
	if e.format == "json" {
		return e.writeJSON(rows)
	}
	return e.table([]string{"CONSUMER", "LIVE", "LETTERS", "PARKED", "AGGS", "OLDEST GAP", "KEYS", "OLDEST KEY", "HORIZON"}, consumerCells(rows),
		[]int{16, 0, 0, 0, 0, 0, 0, 0, 0})
}

// consumerCells are rows as the consumers table shows them.
func consumerCells(rows []consumerRow) [][]string {
	cells := make([][]string, 0, len(rows))
	for _, r := range rows {
		cells = append(cells, []string{r.Consumer, strconv.Itoa(r.LiveMembers), strconv.FormatInt(r.OpenLetters, 10), strconv.FormatInt(r.ParkedRecords, 10),
			strconv.FormatInt(r.ParkedAggregates, 10), age(r.OldestGapSeconds), strconv.FormatInt(r.ProcessedKeys, 10),
			age(r.OldestKeySeconds), fmt.Sprintf("%.0f%%", 100*r.KeyHorizonUsed)})
	}
	return cells
}

// writeJSON writes v as indented JSON.
func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// age prints seconds as a short duration, "-" for none.
func age(seconds float64) string {
	if seconds <= 0 {
		return "-"
	}
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	case d >= time.Hour:
		return d.Round(time.Minute).String()
	default:
		return d.Round(time.Second).String()
	}
}
