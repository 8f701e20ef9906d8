package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/hibiken/asynq"
)

// newLogger returns the worker's structured logger: text or JSON lines on w.
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// parseLevel reads --log-level, for slog and for asynq.
func parseLevel(s string) (slog.Level, asynq.LogLevel, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, asynq.DebugLevel, nil
	case "info":
		return slog.LevelInfo, asynq.InfoLevel, nil
	case "warn", "warning":
		return slog.LevelWarn, asynq.WarnLevel, nil
	case "error":
		return slog.LevelError, asynq.ErrorLevel, nil
	}
	return 0, 0, errors.New("want debug, info, warn or error")
}

// asynqLogger sends asynq's logs to the worker's logger: the message is
// "asynq", asynq's own words the attribute text, so that the worker's
// messages stay constant.
type asynqLogger struct{ l *slog.Logger }

// asynqMsg is the message of every line asynq logs through the worker.
const asynqMsg = "asynq"

func (a asynqLogger) Debug(args ...any) { a.l.Debug(asynqMsg, "text", fmt.Sprint(args...)) }
func (a asynqLogger) Info(args ...any)  { a.l.Info(asynqMsg, "text", fmt.Sprint(args...)) }
func (a asynqLogger) Warn(args ...any)  { a.l.Warn(asynqMsg, "text", fmt.Sprint(args...)) }
func (a asynqLogger) Error(args ...any) { a.l.Error(asynqMsg, "text", fmt.Sprint(args...)) }

// Fatal is what asynq's Logger interface asks for: log, then exit 1.
func (a asynqLogger) Fatal(args ...any) {
	a.l.Error(asynqMsg, "text", fmt.Sprint(args...))
	os.Exit(exitFailure)
}
