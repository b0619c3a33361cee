// Package recordsql converts Kafka record headers to and from the two
// parallel arrays (text[] names, bytea[] values) that the parked and
// dead_letters tables store them in, so that header values that are not
// valid UTF-8 survive the round trip byte for byte.
package recordsql

import (
	"strings"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Split returns the headers' names and values as parallel slices; neither
// is nil, so that the NOT NULL array columns accept them. A name that is not
// valid UTF-8 or holds a NUL byte cannot be PostgreSQL text: its bad bytes
// become U+FFFD. Values are kept byte for byte.
func Split(hs []kgo.RecordHeader) ([]string, [][]byte) {
	keys := make([]string, len(hs))
	values := make([][]byte, len(hs))
	for i, h := range hs {
		keys[i] = TextSafe(h.Key)
		values[i] = h.Value
		if values[i] == nil {
			values[i] = []byte{}
		}
	}
	return keys, values
}

// Join is the inverse of Split. It returns nil for no headers.
func Join(keys []string, values [][]byte) []kgo.RecordHeader {
	if len(keys) == 0 {
		return nil
	}
	hs := make([]kgo.RecordHeader, len(keys))
	for i := range keys {
		hs[i] = kgo.RecordHeader{Key: keys[i]}
		if i < len(values) {
			hs[i].Value = values[i]
		}
	}
	return hs
}

// TextSafe returns s with invalid UTF-8 and NUL bytes replaced by U+FFFD, so
// that PostgreSQL accepts it as text.
func TextSafe(s string) string {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
