package ordering

import "fmt"

// GapPolicy says what to do with a record that arrives ahead of a gap
// (consumer.Config.GapPolicy).
type GapPolicy int

const (
	// GapPark stores the record in the parked table and applies it when the
	// gap fills. The partition keeps flowing. The default.
	GapPark GapPolicy = iota
	// GapFail refuses the record with a *GapError, so that the partition
	// stops and retries it until the gap fills.
	GapFail
	// GapIgnore applies the record, moves the position to it and reports
	// the gap. Records that arrive later with a lower sequence are applied
	// too (dedupe still catches real duplicates): ordering becomes advisory.
	GapIgnore
)

func (p GapPolicy) String() string {
	switch p {
	case GapPark:
		return "park"
	case GapFail:
		return "fail"
	case GapIgnore:
		return "ignore"
	}
	return fmt.Sprintf("GapPolicy(%d)", int(p))
}

// FirstSeenPolicy says how to treat an aggregate's first record when its
// sequence is above 1 (consumer.Config.FirstSeen). See the package
// documentation for why the default is FirstSeenStrict.
type FirstSeenPolicy int

const (
	// FirstSeenStrict treats the record as a gap after sequence 0: it is
	// parked until the sequences before it are applied. The default.
	FirstSeenStrict FirstSeenPolicy = iota
	// FirstSeenBaseline applies the record and takes its sequence as the
	// aggregate's starting point; an earlier record arriving later is then
	// skipped as a duplicate.
	FirstSeenBaseline
)
