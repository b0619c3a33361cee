package consumer_test

import (
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/d419a114/outbox/deadletter"
)

// This file is the reference model of TestModel: what the Processor is
// documented to do with each record and each operator action, written
// without a database. model_test.go drives the real Processor and the model
// side by side and compares them after every step. The rules, each from
// the code it restates (processor_record.go, processor_batch.go,
// operate_resolve.go, message.go, ordering/tracker.go,
// deadletter/store.go), under the default ordering.GapPark and
// ordering.FirstSeenStrict:
//
//   - A record that fails to parse (a bad or doubled sequence header, an
//     idempotency key over outbox.MaxIdempotencyKeyBytes, a binary record
//     key with a sequence, a value over Config.MaxValueBytes) goes straight
//     to deadLetter: if its key is claimed it is a Duplicate (item 8: a
//     claimed key is a duplicate even when malformed); if its record's
//     letter was resolved it is a Duplicate; else its letter is created (or
//     updated when the same record failed before). A letter with a
//     sequence holds its aggregate without moving its position.
//   - A parsed record whose key is claimed (applied, parked, or claimed by
//     Discard) is a Duplicate.
//   - Fresh key, sequence at or below the position: a different event
//     reuses the sequence (or an operator skipped it): dead-lettered at once
//     as SequenceReused, holding nothing.
//   - Fresh key, sequence above position+1 (a gap; for an aggregate never
//     seen the position is 0, so a first sighting above 1 is a gap): parked,
//     its key claimed; if another record is parked at that sequence it is
//     dead-lettered as SequenceReused instead.
//   - Fresh key, sequence position+1 (or no sequence at all): the handler
//     runs. Success applies it and drains the parked records now in line,
//     each with its own retries; a drained record whose handler fails for
//     its own sake is dead-lettered in the same transaction (its key
//     released) and stops the drain. A record-class failure (an error, a
//     panic, Permanent, a HandlerTimeout) dead-letters the record after
//     Config.MaxAttempts tries (at once when Permanent). A transient
//     SQLSTATE (40001 here) in the handler's own statement while the
//     database answers other work is the record's fault too: counted and
//     dead-lettered the same way, never retried without bound.
//   - During an outage (every connection and statement fails) every
//     record of the poll is handed back with an error: nothing changes,
//     nothing is dead-lettered.
//   - A record handed back ends the poll: it and the records after it are
//     not done and are polled again, first, as Kafka would redeliver them.
//   - Replay(letter): re-parse; a claimed key is a Duplicate (marked
//     replayed); otherwise as above but with one handler run and any
//     failure returned to the operator, nothing changed; a sequence at or
//     below the position fails with ErrSequencePassed; a gap parks it.
//   - Discard(letter): claims its key; a sequence above position+1 fails
//     with ErrNotNext; at position+1 the position moves past it and the
//     parked successors drain; at or below the position nothing else.
//   - ResolveGap(agg): needs parked records (an open gap); skips the
//     missing sequences below the lowest parked one, or, when an open
//     letter lies inside the gap, below the lowest such letter (refusing
//     when that letter is next in line); drains only when it skipped up to
//     the parked record.
//   - Batch mode and BatchHandler mode give the same results as one record
//     at a time (attempt counts aside).

// recKind is what a model record is made of.
type recKind int

const (
	recGood      recKind = iota // the wire contract, with a sequence
	recNoSeq                    // the wire contract without a sequence: dedupe only
	recBadSeq                   // a sequence header that is not a sequence
	recTwoSeqs                  // two sequence headers with different values
	recLongKey                  // an idempotency key over outbox.MaxIdempotencyKeyBytes, with a sequence
	recBinaryKey                // a binary record key, no aggregate-id header, a sequence
	recBigValue                 // a value over Config.MaxValueBytes, with a sequence
)

func (k recKind) String() string {
	return [...]string{"good", "no-seq", "bad-seq", "two-seqs", "long-key", "binary-key", "big-value"}[k]
}

// mRecord is one record instance: a delivery of it again (the same rid, so
// the same offset) is a Kafka redelivery; another instance with the same
// key is a producer's duplicate.
type mRecord struct {
	rid  int64 // its offset; unique within an iteration
	kind recKind
	agg  string // the aggregate id it claims
	seq  int64  // the sequence header it carries (0: none)
	key  string // the idempotency key in its headers
}

// parsed is what the Processor's parse makes of r: ok false means it is
// dead-lettered at once. key, agg and seq are what the letter keeps.
func (r mRecord) parsed() (ok bool, key, agg string, seq int64) {
	switch r.kind {
	case recGood:
		return true, r.key, r.agg, r.seq
	case recNoSeq:
		return true, r.key, r.agg, 0
	case recBadSeq, recTwoSeqs:
		return false, r.key, r.agg, 0
	case recLongKey:
		return false, "", r.agg, r.seq
	case recBinaryKey:
		return false, r.key, "", 0
	case recBigValue:
		return false, r.key, r.agg, r.seq
	}
	panic("unknown kind")
}

// fault is how the test's handler behaves for a key until it is healed.
type fault int

const (
	faultNone      fault = iota
	faultTransient       // a real SQLSTATE 40001 from the handler's statement: counted while the database answers
	faultFail            // a plain error: retried, then dead-lettered
	faultPermanent       // consumer.Permanent: dead-lettered at once
	faultPanic           // a panic: retried, then dead-lettered
	faultHang            // waits for its ctx: HandlerTimeout, retried, dead-lettered
)

func (f fault) String() string {
	return [...]string{"none", "transient", "fail", "permanent", "panic", "hang"}[f]
}

// outcome is what became of one record, or of an operator action.
type outcome int

const (
	outApplied outcome = iota + 1
	outDuplicate
	outParked
	outDeadLettered
	outHandedBack // not done: handed back with an error
)

func (o outcome) String() string {
	return [...]string{"?", "applied", "duplicate", "parked", "dead_lettered", "handed_back"}[o]
}

// opErr classifies an operator action's error.
type opErr int

const (
	errNone opErr = iota
	errResolved
	errPassed
	errNotNext
	errOther
)

func (e opErr) String() string {
	return [...]string{"nil", "ErrResolved", "ErrSequencePassed", "ErrNotNext", "error"}[e]
}

// result is the model's (or the Processor's) answer for one record.
type result struct {
	out     outcome
	drained int
	letter  int64 // the rid of the letter, for outDeadLettered
}

func (r result) String() string {
	s := r.out.String()
	if r.drained > 0 {
		s += fmt.Sprintf("+%d", r.drained)
	}
	if r.out == outDeadLettered {
		s += fmt.Sprintf("@%d", r.letter)
	}
	return s
}

type mParked struct {
	rid int64
	key string
}

type mLetter struct {
	rid     int64
	parseOK bool
	key     string
	agg     string
	seq     int64
	status  deadletter.Status
	rec     mRecord
}

type mGap struct {
	agg                   string
	expected, firstParked int64
	parked                int
	letterSeq             int64
}

// model is the reference: the state the consumer's tables should be in.
type model struct {
	maxAttempts int
	faults      map[string]fault
	claimed     map[string]bool
	pos         map[string]int64
	parked      map[string]map[int64]mParked
	// applied holds each aggregate's applied keys in order; the
	// unsequenced ones under their aggregate too.
	applied map[string][]string
	letters map[int64]*mLetter
	// order is the rids of letters in creation order, which is their ids'
	// order in every mode.
	order []int64
	// discarded holds the keys a Discard claimed before they were applied:
	// events given up on deliberately.
	discarded map[string]bool
	// skipped holds the sequences an operator skipped (ResolveGap, or
	// Discard moving past a letter).
	skipped map[string]map[int64]bool
	// stuck is set when the model reaches a state the Processor cannot get
	// out of by itself; see drainOne.
	stuck string
}

func newModel(maxAttempts int) *model {
	return &model{
		maxAttempts: maxAttempts, faults: map[string]fault{}, claimed: map[string]bool{}, pos: map[string]int64{},
		parked: map[string]map[int64]mParked{}, applied: map[string][]string{}, letters: map[int64]*mLetter{},
		discarded: map[string]bool{}, skipped: map[string]map[int64]bool{},
	}
}

func (m *model) clone() *model {
	c := *m
	c.faults = maps.Clone(m.faults)
	c.claimed = maps.Clone(m.claimed)
	c.pos = maps.Clone(m.pos)
	c.parked = map[string]map[int64]mParked{}
	for a, ps := range m.parked {
		c.parked[a] = maps.Clone(ps)
	}
	c.applied = map[string][]string{}
	for a, ks := range m.applied {
		c.applied[a] = slices.Clone(ks)
	}
	c.letters = map[int64]*mLetter{}
	for rid, l := range m.letters {
		lc := *l
		c.letters[rid] = &lc
	}
	c.order = slices.Clone(m.order)
	c.discarded = maps.Clone(m.discarded)
	c.skipped = map[string]map[int64]bool{}
	for a, s := range m.skipped {
		c.skipped[a] = maps.Clone(s)
	}
	return &c
}

// restore makes m what c was: the rollback of a failed transaction.
func (m *model) restore(c *model) { *m = *c }

// poll processes recs in order as one partition's poll: after the first
// record handed back, the rest are handed back undone.
func (m *model) poll(recs []mRecord) []result {
	out := make([]result, 0, len(recs))
	for i, r := range recs {
		res := m.process(r)
		out = append(out, res)
		if res.out == outHandedBack {
			for range recs[i+1:] {
				out = append(out, result{out: outHandedBack})
			}
			break
		}
	}
	return out
}

func (m *model) process(r mRecord) result {
	ok, key, agg, seq := r.parsed()
	if !ok {
		return m.deadLetter(r)
	}
	if m.claimed[key] {
		return result{out: outDuplicate}
	}
	if seq == 0 {
		return m.runInOrder(r, false)
	}
	pos := m.pos[agg]
	switch {
	case seq <= pos:
		return m.deadLetter(r) // SequenceReused
	case seq > pos+1:
		if _, taken := m.parked[agg][seq]; taken {
			return m.deadLetter(r) // SequenceReused, parked
		}
		m.park(agg, seq, r.rid, key)
		return result{out: outParked}
	}
	return m.runInOrder(r, false)
}

func (m *model) park(agg string, seq, rid int64, key string) {
	if m.parked[agg] == nil {
		m.parked[agg] = map[int64]mParked{}
	}
	m.parked[agg][seq] = mParked{rid: rid, key: key}
	m.claimed[key] = true
}

// runInOrder runs the handler for r, which is next in line (or has no
// sequence), and drains its successors. replay means the operator's one
// try: every failure is returned (as outHandedBack) instead.
func (m *model) runInOrder(r mRecord, replay bool) result {
	_, key, agg, seq := r.parsed()
	switch f := m.faults[key]; {
	case replay && f != faultNone:
		return result{out: outHandedBack}
	case f != faultNone:
		return m.deadLetter(r)
	}
	before := m.clone()
	m.claimed[key] = true
	m.applied[agg] = append(m.applied[agg], key)
	if seq == 0 {
		return result{out: outApplied}
	}
	m.pos[agg] = seq
	n, ok := m.drain(agg)
	if !ok {
		m.restore(before)
		return result{out: outHandedBack}
	}
	return result{out: outApplied, drained: n}
}

// drain applies agg's parked records that are in line; ok false means the
// drain failed as a database error (the caller restores).
func (m *model) drain(agg string) (n int, ok bool) {
	for {
		seq := m.pos[agg] + 1
		p, found := m.parked[agg][seq]
		if !found {
			return n, true
		}
		delete(m.parked[agg], seq)
		switch m.faults[p.key] {
		case faultNone:
			m.applied[agg] = append(m.applied[agg], p.key)
			m.pos[agg] = seq
			n++
		default:
			// Dead-lettered in the transaction, its key released.
			delete(m.claimed, p.key)
			l := m.letters[p.rid]
			switch {
			case l == nil:
				m.letters[p.rid] = &mLetter{rid: p.rid, parseOK: true, key: p.key, agg: agg, seq: seq, status: deadletter.StatusDead,
					rec: mRecord{rid: p.rid, kind: recGood, agg: agg, seq: seq, key: p.key}}
				m.order = append(m.order, p.rid)
			case l.status != deadletter.StatusDead:
				// Put refuses a resolved letter, and the drain fails as
				// a database error: the releasing record is handed back
				// for ever. The model flags it.
				m.stuck = fmt.Sprintf("parked record %d of %s at %d failed in a drain, and its letter is %s", p.rid, agg, seq, l.status)
				return n, false
			}
			return n, true
		}
	}
}

// deadLetter is the Processor's deadLetter: a Duplicate when the key is
// claimed or the record's letter was resolved, else the letter.
func (m *model) deadLetter(r mRecord) result {
	ok, key, agg, seq := r.parsed()
	if key != "" && m.claimed[key] {
		return result{out: outDuplicate}
	}
	if l := m.letters[r.rid]; l != nil {
		if l.status != deadletter.StatusDead {
			return result{out: outDuplicate}
		}
		return result{out: outDeadLettered, letter: r.rid}
	}
	m.letters[r.rid] = &mLetter{rid: r.rid, parseOK: ok, key: key, agg: agg, seq: seq, status: deadletter.StatusDead, rec: r}
	m.order = append(m.order, r.rid)
	return result{out: outDeadLettered, letter: r.rid}
}

// openLetters returns the rids of the open letters, oldest first.
func (m *model) openLetters() []int64 {
	var out []int64
	for _, rid := range m.order {
		if m.letters[rid].status == deadletter.StatusDead {
			out = append(out, rid)
		}
	}
	return out
}

func (m *model) replay(rid int64) (result, opErr) {
	l := m.letters[rid]
	if l == nil || l.status != deadletter.StatusDead {
		return result{}, errResolved
	}
	if !l.parseOK {
		return result{}, errOther
	}
	before := m.clone()
	var res result
	switch pos := m.pos[l.agg]; {
	case m.claimed[l.key]:
		res = result{out: outDuplicate}
	case l.seq == 0:
		res = m.runInOrder(l.rec, true)
	case l.seq <= pos:
		return result{}, errPassed
	case l.seq > pos+1:
		if _, taken := m.parked[l.agg][l.seq]; taken {
			return result{}, errOther
		}
		return result{}, errNotNext
	default:
		res = m.runInOrder(l.rec, true)
	}
	if res.out == outHandedBack {
		m.restore(before)
		return result{}, errOther
	}
	m.letters[rid].status = deadletter.StatusReplayed
	return res, errNone
}

func (m *model) discard(rid int64) (int, opErr) {
	l := m.letters[rid]
	if l == nil || l.status != deadletter.StatusDead {
		return 0, errResolved
	}
	before := m.clone()
	if l.key != "" && !m.claimed[l.key] {
		m.claimed[l.key] = true
		m.discarded[l.key] = true
	}
	n := 0
	if pos := m.pos[l.agg]; l.seq != 0 && pos < l.seq {
		if pos < l.seq-1 {
			m.restore(before)
			return 0, errNotNext
		}
		m.skip(l.agg, pos, l.seq)
		var ok bool
		if n, ok = m.drain(l.agg); !ok {
			m.restore(before)
			return 0, errOther
		}
	}
	m.letters[rid].status = deadletter.StatusDiscarded
	return n, errNone
}

// skip moves agg's position from pos to to, noting the skipped sequences.
func (m *model) skip(agg string, pos, to int64) {
	if m.skipped[agg] == nil {
		m.skipped[agg] = map[int64]bool{}
	}
	for s := pos + 1; s <= to; s++ {
		m.skipped[agg][s] = true
	}
	m.pos[agg] = to
}

func (m *model) gaps() []mGap {
	var out []mGap
	for agg, ps := range m.parked {
		if len(ps) == 0 {
			continue
		}
		g := mGap{agg: agg, expected: m.pos[agg] + 1, parked: len(ps), firstParked: slices.Min(slices.Collect(maps.Keys(ps)))}
		for _, l := range m.letters {
			if l.status == deadletter.StatusDead && l.agg == agg && l.seq > m.pos[agg] && l.seq < g.firstParked &&
				(g.letterSeq == 0 || l.seq < g.letterSeq) {
				g.letterSeq = l.seq
			}
		}
		out = append(out, g)
	}
	// An aggregate with nothing parked shows a gap when its lowest open
	// letter lies beyond the next sequence.
	for _, l := range m.letters {
		if l.status != deadletter.StatusDead || l.seq <= m.pos[l.agg]+1 || len(m.parked[l.agg]) > 0 {
			continue
		}
		i := slices.IndexFunc(out, func(g mGap) bool { return g.agg == l.agg })
		if i < 0 {
			out = append(out, mGap{agg: l.agg, expected: m.pos[l.agg] + 1, letterSeq: l.seq})
		} else if l.seq < out[i].letterSeq {
			out[i].letterSeq = l.seq
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].agg < out[j].agg })
	return out
}

func (m *model) resolveGap(agg string) (int, opErr) {
	var g *mGap
	for _, x := range m.gaps() {
		if x.agg == agg {
			g = &x
		}
	}
	if g == nil {
		return 0, errOther
	}
	to := g.firstParked - 1
	if g.letterSeq != 0 {
		if g.letterSeq == g.expected {
			return 0, errOther
		}
		to = g.letterSeq - 1
	}
	before := m.clone()
	m.skip(agg, m.pos[agg], to)
	if to < g.firstParked-1 {
		return 0, errNone
	}
	n, ok := m.drain(agg)
	if !ok {
		m.restore(before)
		return 0, errOther
	}
	return n, errNone
}
