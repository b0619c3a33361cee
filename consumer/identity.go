package consumer

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// identity is what tells a record's content apart, stored with its key
// when the key is claimed: its aggregate and sequence (when it has them)
// and a hash of its payload. A redelivery of the same event, or the same
// event published twice, has the same identity; a record that reuses
// another event's key with another sequence or payload does not. Headers
// are left out: a relay that publishes an event again may give it a new
// trace context, which says nothing about the event.
func (m *Message) identity() string {
	sum := sha256.Sum256(m.Value)
	h := hex.EncodeToString(sum[:16])
	if m.AggregateType == "" && m.AggregateID == "" && m.Seq == 0 {
		return "payload sha256:" + h
	}
	return fmt.Sprintf("%s@%d payload sha256:%s", m.aggregate(), m.Seq, h)
}

// ConflictingDuplicateError reports a record whose idempotency key was
// claimed before by a record of another identity (another aggregate,
// sequence or payload): not a redelivery but a different event under a
// key already used, which a producer that reuses keys, or events numbered
// again after a database failover lost committed ones, causes. It is
// permanent: the record is dead-lettered (reason conflict) with both
// identities in its error, and never skipped as a duplicate.
type ConflictingDuplicateError struct {
	// Key is the idempotency key both records carry.
	Key string
	// Stored is the identity stored when the key was claimed.
	Stored string
	// Got is the identity of this record.
	Got string
}

func (e *ConflictingDuplicateError) Error() string {
	return fmt.Sprintf("consumer: idempotency key %q was claimed by another event (stored %s, this record %s): a producer reused the key, or renumbered events after a failover; the stored event was applied and this one was not: find out which is right, then discard this letter (a replay conflicts again)", e.Key, e.Stored, e.Got)
}
