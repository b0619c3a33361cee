package consumertest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/d419a114/outbox/consumer"
	"github.com/d419a114/outbox/ordering"
)

// step is one thing a schedule does: a poll of records (sample indices,
// see harness.record), a restart of the Processor (with the last poll's
// offsets lost, so that it comes again), or an operator's ResolveGap that
// starts an aggregate whose sample begins above sequence 1.
type step struct {
	poll        []int
	restart     bool
	lostOffsets bool
	resolve     *ordering.Aggregate
}

// schedule is one drawn way of delivering the samples.
type schedule struct {
	plain  bool
	plan   []step
	faults map[int]fault
	steps  []string
}

// newSchedule draws a schedule: every sample delivered at least once, in
// an order that reorders neighbours, delays some records behind later
// ones (gaps), redelivers some and duplicates some as a producer would, in
// polls of one to five records, with restarts between polls; and faults
// after the handler for some samples, fewer tries than MaxAttempts (so the
// record ends applied) or every try until the end (so it is dead-lettered
// and then replayed). A plain schedule has none of that: every sample
// once, in order, in one poll, without faults.
func newSchedule(rng *rand.Rand, samples []sample, cfg consumer.Config, plain bool) *schedule {
	n := len(samples)
	sc := &schedule{faults: map[int]fault{}}
	describe := func(x int) string {
		s := samples[x%n]
		d := fmt.Sprintf("#%d", x%n)
		if x >= n {
			d += fmt.Sprintf("(copy %d)", x/n)
		}
		if s.seq > 0 {
			d += fmt.Sprintf(" %s:%d", s.agg.ID, s.seq)
		}
		return d
	}
	addPoll := func(xs []int) {
		sc.plan = append(sc.plan, step{poll: xs})
		var ds []string
		for _, x := range xs {
			ds = append(ds, describe(x))
		}
		sc.steps = append(sc.steps, "poll ["+strings.Join(ds, ", ")+"]")
	}

	// An aggregate whose sample starts above 1 (and, under
	// FirstSeenBaseline, every aggregate: its first record sets the
	// baseline) gets that record first.
	lowest := map[ordering.Aggregate]int{}
	for i, s := range samples {
		if s.seq == 0 {
			continue
		}
		if j, ok := lowest[s.agg]; !ok || s.seq < samples[j].seq {
			lowest[s.agg] = i
		}
	}
	var first []int
	for _, i := range lowest {
		if samples[i].seq > 1 || cfg.FirstSeen == ordering.FirstSeenBaseline {
			first = append(first, i)
		}
	}
	slices.Sort(first)
	if len(first) > 0 {
		addPoll(first)
		if cfg.FirstSeen != ordering.FirstSeenBaseline {
			for _, i := range first {
				agg := samples[i].agg
				sc.plan = append(sc.plan, step{resolve: &agg})
				sc.steps = append(sc.steps, fmt.Sprintf("ResolveGap(%s): start it at seq %d", agg, samples[i].seq))
			}
		}
	}
	var rest []int
	for i := range samples {
		if !slices.Contains(first, i) {
			rest = append(rest, i)
		}
	}
	if plain {
		sc.plain = true
		sc.steps = append([]string{"plain schedule (before the drawn ones): no faults, in order, one batch"}, sc.steps...)
		if len(rest) > 0 {
			addPoll(rest)
		}
		return sc
	}
	if len(rest) > 1 {
		for k := rng.IntN(len(rest)/2 + 1); k > 0; k-- { // neighbours swapped
			i := rng.IntN(len(rest) - 1)
			rest[i], rest[i+1] = rest[i+1], rest[i]
		}
		for k := rng.IntN(3); k > 0; k-- { // one record delayed behind later ones
			i := rng.IntN(len(rest))
			j := i + rng.IntN(len(rest)-i)
			x := rest[i]
			rest = slices.Insert(slices.Delete(rest, i, i+1), j, x)
		}
	}
	for k := 1 + rng.IntN(len(rest)/2+1); k > 0 && len(rest) > 0; k-- { // delivered again
		i := rng.IntN(len(rest))
		x := rest[i] % n
		if rng.IntN(2) == 0 {
			x += n * (1 + rng.IntN(2)) // a producer's duplicate: same record, another offset
		}
		rest = slices.Insert(rest, i+1+rng.IntN(len(rest)-i), x)
	}

	maxTries := cfg.MaxAttempts - 1
	for i := range samples {
		switch r := rng.IntN(12); {
		case r < 3 && maxTries > 0:
			sc.faults[i] = fault{kind: faultKind(rng.IntN(3)), tries: 1 + rng.IntN(maxTries)}
		case r == 3:
			sc.faults[i] = fault{kind: faultPoison}
		}
	}
	if len(sc.faults) == 0 && maxTries > 0 {
		// Always at least one rolled-back try: it is what shows a handler
		// that writes outside its transaction.
		sc.faults[rng.IntN(n)] = fault{kind: faultError, tries: 1}
	}
	var faults []string
	for _, i := range slices.Sorted(mapKeys(sc.faults)) {
		f := sc.faults[i]
		if f.kind == faultPoison {
			faults = append(faults, fmt.Sprintf("fault #%d: every try fails until the end, then its letter is replayed", i))
		} else {
			faults = append(faults, fmt.Sprintf("fault #%d: %s after the handler, %d tries", i, f.kind, f.tries))
		}
	}
	sc.steps = append(faults, sc.steps...)

	for len(rest) > 0 {
		size := min(len(rest), 1+rng.IntN(5))
		addPoll(rest[:size])
		rest = rest[size:]
		if rng.IntN(6) == 0 {
			lost := rng.IntN(2) == 0
			sc.plan = append(sc.plan, step{restart: true, lostOffsets: lost})
			sc.steps = append(sc.steps, fmt.Sprintf("restart (last poll's offsets lost: %v)", lost))
		}
	}
	return sc
}
