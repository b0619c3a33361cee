package dashboard

import (
	"encoding/hex"
	"encoding/json"
	"unicode"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// maxShown bounds how many bytes of a value the letter page prints in
// each view: values can be 16 MiB. The stores read no more than this
// (consumer.Inspector.PeekLetter, and 256 bytes in listings), and every view is
// made from what was read, so a page's memory is bounded before any
// formatting whatever the record holds.
const maxShown = 64 << 10

// maxIndent is the nesting past which the JSON view indents no further: a
// value nested 10,000 deep would otherwise take 10,000 spaces a line.
const maxIndent = 16

// value is a record's key or value in the views the letter page offers,
// each hidden until clicked.
type value struct {
	Size int
	// Cut is set when the views show only a prefix of the value.
	Cut bool
	// Text is the bytes as text, when they are printable UTF-8.
	Text string
	// JSON is the bytes indented, when the whole value was read and is
	// JSON.
	JSON string
	// Hex is a hex dump.
	Hex string
}

// newValue is the views of b, the first bytes of a value of size bytes.
func newValue(b []byte, size int) value {
	shown := cut(b)
	v := value{Size: max(size, len(b)), Cut: len(shown) < max(size, len(b))}
	if !v.Cut && json.Valid(shown) {
		var full bool
		v.JSON, full = indent(shown)
		v.Cut = !full
	}
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

// indent lays valid JSON b out with two spaces a level (up to maxIndent
// levels) in at most maxShown bytes; full is false when it stopped there.
// It allocates its output once, whatever the nesting.
func indent(b []byte) (out string, full bool) {
	buf := make([]byte, 0, min(2*len(b)+64, maxShown+2*maxIndent+2))
	depth := 0
	newline := func() {
		buf = append(buf, '\n')
		for range min(depth, maxIndent) {
			buf = append(buf, ' ', ' ')
		}
	}
	inString, escaped := false, false
	for i := 0; i < len(b); i++ {
		if len(buf) >= maxShown {
			return string(buf[:maxShown]), false
		}
		c := b[i]
		if inString {
			buf = append(buf, c)
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case ' ', '\t', '\n', '\r':
		case '"':
			inString = true
			buf = append(buf, c)
		case '{', '[':
			buf = append(buf, c)
			j := i + 1
			for j < len(b) && (b[j] == ' ' || b[j] == '\t' || b[j] == '\n' || b[j] == '\r') {
				j++
			}
			if j < len(b) && (b[j] == '}' || b[j] == ']') {
				buf = append(buf, b[j])
				i = j
				continue
			}
			depth++
			newline()
		case '}', ']':
			depth--
			newline()
			buf = append(buf, c)
		case ',':
			buf = append(buf, c)
			newline()
		case ':':
			buf = append(buf, ':', ' ')
		default:
			buf = append(buf, c)
		}
	}
	if len(buf) > maxShown {
		return string(buf[:maxShown]), false
	}
	return string(buf), true
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
