// Package human formats figures and names for people, the same way in the
// library's descriptions and the binaries' output.
package human

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Duration prints a duration rounded for people: 1.2s, 350ms, 4m10s.
func Duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// Text returns s as it is when it is valid UTF-8 made of printable
// characters (spaces included), and otherwise quoted with Go's escapes
// ("a\nb", "\x1b[31m"), so that a name or a message with a newline, a tab,
// an escape sequence or invalid bytes cannot break a table's columns or
// change a terminal's state. A text that starts with a double quote is
// quoted too, so a quoted cell always means escapes.
func Text(s string) string {
	if Printable(s) && !strings.HasPrefix(s, `"`) {
		return s
	}
	return strconv.Quote(s)
}

// Printable reports whether s is valid UTF-8 made only of printable
// characters and ASCII spaces.
func Printable(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// Line returns s on one line for a table cell: runs of white space
// (newlines included) become one space, other unprintable characters are
// escaped as Text does, and a text longer than max runes is cut with "…"
// (max 0: no limit).
func Line(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if !Printable(s) {
		q := strconv.Quote(s)
		s = q[1 : len(q)-1]
	}
	if max > 0 && utf8.RuneCountInString(s) > max {
		r := []rune(s)
		s = string(r[:max-1]) + "…"
	}
	return s
}

// Fit cuts a line of a terminal's view to width runes, its last one "…"
// when anything was cut (width 0: no limit). It counts runes, as
// text/tabwriter does when it lines up the columns.
func Fit(s string, width int) string {
	if width <= 0 || utf8.RuneCountInString(s) <= width {
		return s
	}
	return string([]rune(s)[:width-1]) + "…"
}

// Count is n followed by the noun that agrees with it: "1 job", "0 jobs",
// "3 jobs".
func Count[N int | int64](n N, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
