package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// width is the terminal width tables fit in.
const width = 80

// table writes rows under header in columns two spaces apart, each column
// as wide as its widest cell up to its cap in caps (0: no cap), the last
// column cut to what is left of width. Cut cells end in "…".
func table(out io.Writer, header []string, rows [][]string, caps []int) error {
	widths := make([]int, len(header))
	for _, r := range append([][]string{header}, rows...) {
		for i, c := range r[:len(r)-1] {
			n := utf8.RuneCountInString(c)
			if caps[i] > 0 {
				n = min(n, caps[i])
			}
			widths[i] = max(widths[i], n)
		}
	}
	used := 0
	for _, w := range widths[:len(widths)-1] {
		used += w + 2
	}
	widths[len(widths)-1] = max(width-used, 8)
	for _, r := range append([][]string{header}, rows...) {
		var b strings.Builder
		for i, c := range r {
			c = cut(c, widths[i])
			if i == len(r)-1 {
				b.WriteString(c)
				break
			}
			b.WriteString(c + strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c)+2))
		}
		line := strings.TrimRight(b.String(), " ")
		if r := []rune(line); len(r) > width {
			// The fixed columns alone are too wide: the line, not only its
			// last cell, is cut to fit.
			line = string(r[:width-1]) + "…"
		}
		if _, err := fmt.Fprintln(out, line); err != nil {
			return err
		}
	}
	return nil
}

// cut shortens s to n runes, marking the cut with "…", and puts it on one
// line with its control characters escaped.
func cut(s string, n int) string {
	s = safe(strings.Join(strings.Fields(s), " "))
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// safe escapes what a terminal would act on instead of print: control
// characters (ANSI escape sequences start with one), bidirectional
// overrides, and bytes that are not UTF-8, as Go escapes them (\x1b,
// \u202e); it keeps newlines and tabs. A record's fields come from
// whoever produced it, and printed raw they could clear the operator's
// screen and forge what it shows.
func safe(s string) string {
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// ago prints how long ago t was, as age does; "-" for the zero time.
func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return age(time.Since(t).Seconds())
}

// when reads a -since or -until value: a duration ago, or an RFC 3339
// time; empty is the zero time.
func when(flag, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, usageError("-%s %q: want a duration ago (2h) or an RFC 3339 time", flag, v)
	}
	return t, nil
}
