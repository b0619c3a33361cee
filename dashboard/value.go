package dashboard

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"unicode"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// maxShown bounds how many bytes of a value the letter page prints in
// each view: values can be 16 MiB.
const maxShown = 64 << 10

// value is a record's key or value in the views the letter page offers,
// each hidden until clicked.
type value struct {
	Size int
	// Cut is set when the views show only the first maxShown bytes.
	Cut bool
	// Text is the bytes as text, when they are printable UTF-8.
	Text string
	// JSON is the bytes indented, when they are JSON.
	JSON string
	// Hex is a hex dump.
	Hex string
}

func newValue(b []byte) value {
	v := value{Size: len(b)}
	if json.Valid(b) {
		var out bytes.Buffer
		if err := json.Indent(&out, b, "", "  "); err == nil {
			v.JSON = string(cut(out.Bytes()))
		}
	}
	shown := cut(b)
	v.Cut = len(shown) < len(b)
	if printable(shown) {
		v.Text = string(shown)
	}
	v.Hex = hex.Dump(shown)
	return v
}

func cut(b []byte) []byte {
	if len(b) > maxShown {
		return b[:maxShown]
	}
	return b
}

// printable reports whether b is UTF-8 text without control characters
// other than white space; a rune cut at the end is allowed.
func printable(b []byte) bool {
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			return len(b) < utf8.UTFMax && !utf8.FullRune(b)
		}
		if !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			return false
		}
		b = b[n:]
	}
	return true
}

// header is one record header as the letter page shows it: as text when
// printable, as hex otherwise.
type header struct {
	Key, Value string
	Hex        bool
}

func headers(hs []kgo.RecordHeader) []header {
	out := make([]header, 0, len(hs))
	for _, h := range hs {
		if printable(h.Value) {
			out = append(out, header{Key: h.Key, Value: string(h.Value)})
		} else {
			out = append(out, header{Key: h.Key, Value: hex.EncodeToString(h.Value), Hex: true})
		}
	}
	return out
}
