// Package human formats figures for people, the same way in the library's
// descriptions and the binaries' output.
package human

import "time"

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
