package queue

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"pgregory.net/rapid"
)

// recordKey orders the test's records by their record key.
func recordKey(r *kgo.Record) string { return string(r.Key) }

// queueModel is the reference for a lane's queue: every record received,
// each with its state, and the batches handed out and not yet given back.
type queueModel struct {
	recs    []modelRec
	batches [][]*Entry
}

type modelRec struct {
	offset int64
	key    string
	state  entryState
}

// at returns the model's record at offset.
func (m *queueModel) at(offset int64) *modelRec {
	for i := range m.recs {
		if m.recs[i].offset == offset {
			return &m.recs[i]
		}
	}
	return nil
}

// eligible says whether the record at i may start: it waits, and its key
// is free (nothing in flight) with every earlier record of it done.
func (m *queueModel) eligible(i int) bool {
	r := m.recs[i]
	if r.state != waiting {
		return false
	}
	if r.key == "" {
		return true
	}
	for _, o := range m.recs {
		if o.key == r.key && (o.state == inFlight || o.offset < r.offset && o.state != finished) {
			return false
		}
	}
	return true
}

// TestQueue is the model-based test of the lane's queue: rapid draws
// sequences of fetches (with keys shared, keyless records, and records
// fetched again after a rebalance), picks of batches of any size, and
// batches given back with any prefix done, and checks after every step:
// no two records of one key in flight at once; a record starts only when
// every earlier record of its key is done (so each key's records apply in
// offset order, and a batch's records of one key are consecutive among
// its records); a pick takes every record that may start, up to its
// bound, in offset order; and the done prefix (what the lane commits) is
// exactly the records before the first one not done. At the end every
// record is done. Half the runs are of an unordered queue (a nil key, the
// consumer's Config.Unordered), where every record goes freely. A failure
// prints rapid's seed.
func TestQueue(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		// free is a nil key: no record is ordered against another.
		free := rapid.Bool().Draw(t, "free")
		key := recordKey
		if free {
			key = nil
		}
		q := New(key)
		m := &queueModel{}
		next := int64(0)
		keys := rapid.SampledFrom([]string{"", "a", "b", "c", "d"})

		t.Repeat(map[string]func(*rapid.T){
			"fetch": func(t *rapid.T) {
				var recs []*kgo.Record
				if next > 0 && rapid.Bool().Draw(t, "refetch") {
					// A fetch from before a rebalance: records already had.
					from := rapid.Int64Range(0, next-1).Draw(t, "from")
					for o := from; o < next; o++ {
						recs = append(recs, &kgo.Record{Offset: o, Key: []byte("x")})
					}
				}
				for range rapid.IntRange(1, 6).Draw(t, "records") {
					k := keys.Draw(t, "key")
					r := &kgo.Record{Offset: next, Key: []byte(k)}
					recs = append(recs, r)
					mr := modelRec{offset: next, key: k}
					if free {
						mr.key = ""
					}
					m.recs = append(m.recs, mr)
					next++
				}
				q.Push(recs)
			},
			"pick": func(t *rapid.T) {
				n := rapid.IntRange(1, 5).Draw(t, "n")
				batch := q.Pick(n)
				require.LessOrEqual(t, len(batch), n)
				for i, e := range batch {
					r := m.at(e.rec.Offset)
					require.NotNil(t, r, "picked a record never fetched: %d", e.rec.Offset)
					require.Equal(t, waiting, r.state, "picked offset %d, which is not waiting", r.offset)
					require.True(t, m.eligible(indexOf(m, r.offset)), "picked offset %d (key %q) before its key is free", r.offset, r.key)
					if i > 0 {
						require.Greater(t, e.rec.Offset, batch[i-1].rec.Offset, "batch out of offset order")
					}
					// The next record of its key may join the batch.
					r.state = finished
				}
				for _, e := range batch {
					m.at(e.rec.Offset).state = inFlight
				}
				if len(batch) < n {
					for i := range m.recs {
						require.False(t, m.eligible(i), "pick left offset %d, which may start", m.recs[i].offset)
					}
				}
				if len(batch) > 0 {
					m.batches = append(m.batches, batch)
				}
			},
			"finish": func(t *rapid.T) {
				if len(m.batches) == 0 {
					t.Skip("nothing in flight")
				}
				i := rapid.IntRange(0, len(m.batches)-1).Draw(t, "batch")
				batch := m.batches[i]
				m.batches = append(m.batches[:i], m.batches[i+1:]...)
				n := rapid.IntRange(0, len(batch)).Draw(t, "done")
				for j, e := range batch {
					m.at(e.rec.Offset).state = waiting
					if j < n {
						m.at(e.rec.Offset).state = finished
					}
				}
				q.Finish(batch, n)
			},
			"": func(t *rapid.T) { checkQueue(t, q, m) },
		})

		for _, b := range m.batches {
			q.Finish(b, len(b))
			for _, e := range b {
				m.at(e.rec.Offset).state = finished
			}
		}
		m.batches = nil
		for batch := q.Pick(3); batch != nil; batch = q.Pick(3) {
			q.Finish(batch, len(batch))
			for _, e := range batch {
				m.at(e.rec.Offset).state = finished
			}
		}
		checkQueue(t, q, m)
		require.Zero(t, q.Len(), "records left undone")
		if next > 0 {
			require.Equal(t, next-1, q.done.Offset)
		}
	})
}

func indexOf(m *queueModel, offset int64) int {
	for i := range m.recs {
		if m.recs[i].offset == offset {
			return i
		}
	}
	return -1
}

// checkQueue checks q against m: the done prefix, what is held, and the
// keys in flight.
func checkQueue(t *rapid.T, q *Queue, m *queueModel) {
	prefix := 0
	for prefix < len(m.recs) && m.recs[prefix].state == finished {
		prefix++
	}
	if prefix == 0 {
		require.Nil(t, q.done, "a done prefix before the first record is done")
	} else {
		require.NotNil(t, q.done)
		require.Equal(t, m.recs[prefix-1].offset, q.done.Offset, "done prefix")
	}
	require.Equal(t, len(m.recs)-prefix, q.Len(), "records held")
	busy := map[string]int{}
	for _, r := range m.recs {
		if r.state == inFlight && r.key != "" {
			busy[r.key]++
		}
	}
	require.Equal(t, busy, q.busy, "keys in flight")
	for k, n := range busy {
		if n > 1 {
			// Several of one key are in flight only inside one batch.
			held := 0
			for _, b := range m.batches {
				for _, e := range b {
					if e.key == k {
						held++
						break
					}
				}
			}
			require.Equal(t, 1, held, "key %q in flight in %d batches", k, held)
		}
	}
}
