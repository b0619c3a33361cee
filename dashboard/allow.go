package dashboard

import (
	"net/http"

	"github.com/d419a114/outbox/deadletter"
	"github.com/d419a114/outbox/operator"
)

// CancelAction is [Act.Action] for the cancel of an operator request.
const CancelAction operator.Action = "cancel"

// Act is an action an actor asks the dashboard to carry out, as
// [Config.Allow] sees it: what, and on what.
type Act struct {
	// Action is operator.Replay, Discard or ResolveGap for a consumer's
	// letters or gap (carried out as an operator request), or
	// operator.ReplayEvent or DiscardEvent for a producer dead event, or
	// CancelAction for the cancel of request RequestID.
	Action operator.Action
	// RequestID is the request a cancel is for.
	RequestID int64
	// Consumer is the consumer of a request; "" for a dead event.
	Consumer string
	// LetterID is the one letter of a single replay or discard;
	// DeadEventID the dead event. 0 otherwise.
	LetterID, DeadEventID int64
	// All is set for every open letter of Consumer; otherwise Letters is
	// the filter of a bulk action (Consumer set, the rest as chosen) or
	// the aggregate of a resolve-gap.
	All     bool
	Letters deadletter.ListOpts
}

// allow asks [Config.Allow] whether actor may carry out act; nil when it is
// unset or allows it.
func (d *Dashboard) allow(r *http.Request, actor string, act Act) error {
	if d.cfg.Allow == nil {
		return nil
	}
	return d.cfg.Allow(r, actor, act)
}

// requestAct is the Act of operator request req.
func requestAct(req *operator.Request) Act {
	l := req.Letters
	l.Consumer = req.Consumer
	return Act{Action: req.Action, Consumer: req.Consumer, LetterID: req.LetterID, All: req.All, Letters: l}
}

// deadEventAct is the Act of action (replay or discard) on producer dead
// event id.
func deadEventAct(action operator.Action, id int64) Act {
	a := operator.ReplayEvent
	if action == operator.Discard {
		a = operator.DiscardEvent
	}
	return Act{Action: a, DeadEventID: id}
}
