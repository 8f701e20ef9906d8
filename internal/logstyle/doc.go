// Package logstyle holds the test that sluice's log messages are written
// as slog means them: a short constant message, with what varies in
// attributes ("no handler for task type", "type", t), never a message
// built at run time from an error's text or by concatenation, so that a
// log search or an alert on a message finds every line of it. It has no
// code.
package logstyle
