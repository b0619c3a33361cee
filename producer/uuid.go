package producer

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"
)

// uuidV7 returns a new UUIDv7 (RFC 9562) in canonical text form. The 12 bits
// after the millisecond timestamp count up within one millisecond, so ids
// made by one process sort in creation order.
func uuidV7() string {
	var u [16]byte
	ms, seq := v7clock.next()
	// Each byte takes its octet of the value: truncation is the point.
	u[0], u[1], u[2], u[3], u[4], u[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms) //nolint:gosec // as said
	u[6] = 0x70 | byte(seq>>8)&0x0f
	u[7] = byte(seq) //nolint:gosec // as said
	_, _ = rand.Read(u[8:])
	u[8] = u[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return string(s[:])
}

type monotonic struct {
	mu  sync.Mutex
	ms  int64
	seq uint16
}

var v7clock monotonic

func (m *monotonic) next() (int64, uint16) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now().UnixMilli()
	if now > m.ms {
		m.ms, m.seq = now, 0
	} else if m.seq++; m.seq > 0x0fff {
		// 4096 ids in one millisecond: borrow the next millisecond rather
		// than break the order.
		m.ms, m.seq = m.ms+1, 0
	}
	return m.ms, m.seq
}
