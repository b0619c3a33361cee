package history

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	order   = Aggregate{Type: "order", ID: "1"}
	account = Aggregate{Type: "account", ID: "7"}
)

// ev names the event of aggregate a with sequence number seq.
func ev(a Aggregate, seq int64) string { return fmt.Sprintf("%s#%d", a, seq) }

func wrote(r *Recorder, a Aggregate, seq int64) {
	r.Write(Write{EventID: ev(a, seq), Aggregate: a, Seq: seq, Committed: true})
}

func applied(r *Recorder, a Aggregate, seq int64) {
	r.Handle(Handle{Key: ev(a, seq), Aggregate: a, Seq: seq, Applied: true})
}

func skipped(r *Recorder, a Aggregate, seq int64) {
	r.Handle(Handle{Key: ev(a, seq), Aggregate: a, Seq: seq, Applied: false})
}

// anomalies is the part of a Report a test case pins down exactly.
type anomalies struct {
	Lost, Phantom, Duplicates, Reorders, Redeliveries int
}

func anomaliesOf(r Report) anomalies {
	return anomalies{r.Lost, r.Phantom, r.Duplicates, r.Reorders, r.Redeliveries}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// history records writes and handler calls, in order.
		history func(r *Recorder)
		want    anomalies
		// examples must each appear in the report's String.
		examples []string
	}{
		{
			name:    "Empty",
			history: func(*Recorder) {},
		},
		{
			name: "CleanTwoAggregatesInterleaved",
			history: func(r *Recorder) {
				for seq := int64(1); seq <= 3; seq++ {
					wrote(r, order, seq)
					wrote(r, account, seq)
				}
				applied(r, order, 1)
				applied(r, account, 1)
				applied(r, account, 2)
				applied(r, order, 2)
				applied(r, order, 3)
				applied(r, account, 3)
			},
		},
		{
			name: "RolledBackWriteNeverAppliedIsNotLost",
			history: func(r *Recorder) {
				r.Write(Write{EventID: "rolled-back", Aggregate: order, Seq: 1})
				wrote(r, order, 1) // the retry reuses seq 1 under a new id
				applied(r, order, 1)
			},
		},
		{
			name: "Lost",
			history: func(r *Recorder) {
				wrote(r, order, 1)
				wrote(r, account, 1)
				wrote(r, account, 2)
				applied(r, order, 1)
			},
			want:     anomalies{Lost: 2},
			examples: []string{ev(account, 1), ev(account, 2)},
		},
		{
			name: "OnlySkippedAsDuplicateIsLost",
			history: func(r *Recorder) {
				wrote(r, order, 1)
				skipped(r, order, 1)
			},
			want: anomalies{Lost: 1},
		},
		{
			name: "PhantomFromRollback",
			history: func(r *Recorder) {
				r.Write(Write{EventID: "ghost", Aggregate: order, Seq: 1})
				r.Handle(Handle{Key: "ghost", Aggregate: order, Seq: 1, Applied: true})
			},
			want:     anomalies{Phantom: 1},
			examples: []string{"ghost"},
		},
		{
			name: "PhantomNeverWritten",
			history: func(r *Recorder) {
				wrote(r, order, 1)
				applied(r, order, 1)
				r.Handle(Handle{Key: "foreign-1", Aggregate: account})
				r.Handle(Handle{Key: "foreign-2", Aggregate: account, Applied: true})
				r.Handle(Handle{Key: "foreign-3", Aggregate: account, Applied: true})
			},
			// foreign-1 was skipped, not applied: no effect, no phantom.
			want: anomalies{Phantom: 2},
		},
		{
			name: "DuplicateEffects",
			history: func(r *Recorder) {
				wrote(r, order, 1)
				wrote(r, order, 2)
				applied(r, order, 1)
				applied(r, order, 1)
				applied(r, order, 2)
				applied(r, order, 1)
			},
			// Two extra applications of seq 1; neither counts as a reorder.
			want:     anomalies{Duplicates: 2, Redeliveries: 2},
			examples: []string{ev(order, 1)},
		},
		{
			name: "RedeliveriesSkippedAreNoAnomaly",
			history: func(r *Recorder) {
				wrote(r, order, 1)
				wrote(r, order, 2)
				applied(r, order, 1)
				skipped(r, order, 1)
				applied(r, order, 2)
				skipped(r, order, 1)
				skipped(r, order, 2)
			},
			want: anomalies{Redeliveries: 3},
		},
		{
			name: "ReorderLowerAfterHigher",
			history: func(r *Recorder) {
				for seq := int64(1); seq <= 3; seq++ {
					wrote(r, order, seq)
				}
				applied(r, order, 1)
				applied(r, order, 3) // gap: 2 expected
				applied(r, order, 2) // lower than 3
			},
			want:     anomalies{Reorders: 2},
			examples: []string{"order/1 order/1#3 seq 3 after 1", "order/1 order/1#2 seq 2 after 3"},
		},
		{
			name: "ReorderCountsOnlyTheOutOfOrderApplications",
			history: func(r *Recorder) {
				for seq := int64(1); seq <= 4; seq++ {
					wrote(r, order, seq)
				}
				applied(r, order, 1)
				applied(r, order, 3) // gap
				applied(r, order, 2) // lower
				applied(r, order, 4) // follows the highest applied: in order
			},
			want: anomalies{Reorders: 2},
		},
		{
			name: "ReorderGapWithLoss",
			history: func(r *Recorder) {
				for seq := int64(1); seq <= 3; seq++ {
					wrote(r, order, seq)
				}
				applied(r, order, 1)
				applied(r, order, 3)
			},
			want: anomalies{Lost: 1, Reorders: 1},
		},
		{
			name: "ReorderFirstEffectNotLowestCommittedSeq",
			history: func(r *Recorder) {
				wrote(r, order, 4)
				wrote(r, order, 5)
				applied(r, order, 5)
				applied(r, order, 4)
			},
			// The history may start mid-stream (seq 4), but 5 before 4 is
			// two out-of-order applications.
			want: anomalies{Reorders: 2},
		},
		{
			name: "ReorderIsPerAggregate",
			history: func(r *Recorder) {
				wrote(r, order, 1)
				wrote(r, order, 2)
				wrote(r, account, 1)
				wrote(r, account, 2)
				applied(r, order, 1)
				applied(r, account, 2)
				applied(r, order, 2)
				applied(r, account, 1)
			},
			want: anomalies{Reorders: 2},
		},
		{
			name: "UnsequencedRecordsAreNotOrdered",
			history: func(r *Recorder) {
				for _, id := range []string{"b", "a", "c"} {
					r.Write(Write{EventID: id, Aggregate: order, Committed: true})
				}
				for _, id := range []string{"c", "a", "b"} {
					r.Handle(Handle{Key: id, Aggregate: order, Applied: true})
				}
			},
		},
		{
			name: "EveryAnomalyAtOnce",
			history: func(r *Recorder) {
				for seq := int64(1); seq <= 4; seq++ {
					wrote(r, order, seq)
				}
				r.Write(Write{EventID: "ghost", Aggregate: account, Seq: 1})
				applied(r, order, 1)
				applied(r, order, 3)                                                      // reorder (gap)
				applied(r, order, 1)                                                      // duplicate
				skipped(r, order, 3)                                                      // redelivery
				applied(r, order, 2)                                                      // reorder (lower)
				r.Handle(Handle{Key: "ghost", Aggregate: account, Seq: 1, Applied: true}) // phantom
				// seq 4 lost
			},
			want: anomalies{Lost: 1, Phantom: 1, Duplicates: 1, Reorders: 2, Redeliveries: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var r Recorder
			tt.history(&r)
			rep := r.Check()
			require.Equal(t, tt.want, anomaliesOf(rep), "report:\n%s", rep)
			require.Equal(t, tt.want == anomalies{Redeliveries: tt.want.Redeliveries}, rep.OK())
			out := rep.String()
			for _, e := range tt.examples {
				require.Contains(t, out, e)
			}
			if !rep.OK() {
				require.Contains(t, out, "FAIL")
			}
		})
	}
}

func TestCheckTotals(t *testing.T) {
	t.Parallel()
	var r Recorder
	wrote(&r, order, 1)
	r.Write(Write{EventID: "rb", Aggregate: order, Seq: 2})
	wrote(&r, order, 2)
	applied(&r, order, 1)
	skipped(&r, order, 1)
	applied(&r, order, 2)
	rep := r.Check()
	require.Equal(t, 3, rep.Writes)
	require.Equal(t, 2, rep.Committed)
	require.Equal(t, 1, rep.RolledBack)
	require.Equal(t, 3, rep.Handles)
	require.Equal(t, 2, rep.Applied)
	require.Equal(t, 1, rep.Skipped)
	require.True(t, rep.OK())
	t.Logf("\n%s", rep)
}

func TestCheckExamplesAreBounded(t *testing.T) {
	t.Parallel()
	var r Recorder
	for seq := int64(1); seq <= 100; seq++ {
		wrote(&r, order, seq)
	}
	rep := r.Check()
	require.Equal(t, 100, rep.Lost)
	require.Len(t, rep.LostKeys, maxExamples)
	require.Less(t, strings.Count(rep.String(), "#"), 2*maxExamples)
}

// TestRecorderConcurrent records from many goroutines at once (run with
// -race); each goroutine owns its aggregates, as a partition's goroutine does.
func TestRecorderConcurrent(t *testing.T) {
	t.Parallel()
	const (
		goroutines = 8
		perAgg     = 200
	)
	var r Recorder
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := Aggregate{Type: "order", ID: fmt.Sprint(g)}
			for seq := int64(1); seq <= perAgg; seq++ {
				wrote(&r, a, seq)
				applied(&r, a, seq)
				if seq%10 == 0 {
					skipped(&r, a, seq)
				}
				if seq%50 == 0 {
					_ = r.Check() // checking while recording is safe
				}
			}
		}()
	}
	wg.Wait()
	rep := r.Check()
	require.True(t, rep.OK(), "report:\n%s", rep)
	require.Equal(t, goroutines*perAgg, rep.Committed)
	require.Equal(t, goroutines*perAgg, rep.Applied)
	require.Equal(t, goroutines*perAgg/10, rep.Redeliveries)
}
