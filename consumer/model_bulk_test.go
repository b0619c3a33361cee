package consumer_test

import (
	"fmt"
	"slices"

	"pgregory.net/rapid"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/operator"
)

// doBulk submits a bulk request (replay, or discard, of the open letters of
// agg, or of every open letter when agg is empty) in every mode, has each
// mode's Processor carry it out, and compares the request's outcome and
// the tables with the model's: the model acts on the same letters one by
// one, in the order the request takes them, and stops an aggregate at its
// first failure as the request must.
//
// The order comes from consumer.Inspector.MatchLetters; that it is the same in
// every mode and puts each aggregate's sequenced letters in sequence order
// is checked here, so what the model verifies is how a bulk request
// composes single actions: counts, stopping, and the state they leave.
func (h *modelHarness) doBulk(t *rapid.T, action operator.Action, agg string) {
	filter := deadletter.ListOpts{Status: deadletter.StatusDead}
	if agg != "" {
		filter.AggregateType, filter.AggregateID = "order", agg
	}
	orders := make([][]deadletter.Ref, len(h.runs))
	for i, err := range h.inModes(func(i int, r *modeRun) error {
		f := filter
		f.Consumer = r.name
		var err error
		orders[i], err = r.p.Inspector().MatchLetters(h.ctx, &f)
		return err
	}) {
		if err != nil {
			t.Fatalf("%s: match: %v", h.runs[i].md.name, err)
		}
	}
	rids := make([][]int64, len(h.runs))
	for i, r := range h.runs {
		byID := map[int64]int64{}
		for rid, id := range r.letters {
			byID[id] = rid
		}
		for _, ref := range orders[i] {
			rids[i] = append(rids[i], byID[ref.ID])
		}
		if !slices.Equal(rids[i], rids[0]) {
			h.fatalf(t, "%s: a bulk request takes letters %v, %s takes %v", r.md.name, rids[i], h.runs[0].md.name, rids[0])
		}
	}
	last := map[string]int64{}
	for _, ref := range orders[0] {
		if ref.Seq == 0 {
			continue
		}
		if ref.Seq < last[ref.AggregateID] {
			h.fatalf(t, "bulk order %v: seq %d of %s after %d", rids[0], ref.Seq, ref.AggregateID, last[ref.AggregateID])
		}
		last[ref.AggregateID] = ref.Seq
	}

	want := operator.Progress{Matched: int64(len(rids[0]))}
	stopped := map[string]bool{}
	for i, rid := range rids[0] {
		ref := orders[0][i]
		if ref.Seq != 0 && stopped[ref.AggregateType+"/"+ref.AggregateID] {
			want.Skipped++
			continue
		}
		var (
			res result
			n   int
			err opErr
		)
		if action == operator.Replay {
			res, err = h.model.replay(rid)
		} else {
			n, err = h.model.discard(rid)
		}
		switch {
		case err != errNone:
			want.Failed++
			if ref.Seq != 0 {
				stopped[ref.AggregateType+"/"+ref.AggregateID] = true
			}
		case action == operator.Discard:
			want.Discarded++
			want.Drained += int64(n)
		case res.out == outDuplicate:
			want.Duplicates++
			want.Drained += int64(res.drained)
		default:
			want.Applied++
			want.Drained += int64(res.drained)
		}
	}
	h.logf("bulk %s %q of %v -> model %+v", action, agg, rids[0], want)
	h.cov.add(fmt.Sprintf("bulk:%s:failed=%v:skipped=%v", action, want.Failed > 0, want.Skipped > 0))

	got := make([]*operator.Request, len(h.runs))
	for i, err := range h.inModes(func(i int, r *modeRun) error {
		ops := operator.New(&operator.Config{Schema: r.db.Schema})
		id, err := ops.Submit(h.ctx, r.db.Pool, &operator.Request{Consumer: r.name, Action: action, Letters: filter, All: agg == ""})
		if err != nil {
			return err
		}
		if done, err := consumer.ServeOne(r.p, h.ctx); err != nil || !done {
			return fmt.Errorf("serve request %d: carried out %v: %w", id, done, err)
		}
		got[i], err = ops.Get(h.ctx, r.db.Pool, id)
		return err
	}) {
		if err != nil {
			t.Fatalf("%s: bulk: %v", h.runs[i].md.name, err)
		}
	}
	h.check(t)
	for i, r := range h.runs {
		if got[i].Status != operator.Done || got[i].Progress != want {
			h.fatalf(t, "%s: bulk %s gave %s %+v (%s), model %+v", r.md.name, action, got[i].Status, got[i].Progress, got[i].Error, want)
		}
	}
}
