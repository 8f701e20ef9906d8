package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAsynqLoggerKeepsMessagesConstant: asynq's lines reach the worker's
// log with the constant message "asynq" and asynq's words in text.
func TestAsynqLoggerKeepsMessagesConstant(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	a := asynqLogger{l: newLogger(&b, "json", slog.LevelDebug)}
	a.Info("Starting processing")
	a.Warn("Server ", "busy: ", 3)
	var lines []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(b.Bytes()), []byte("\n")) {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(l, &rec))
		delete(rec, "time")
		lines = append(lines, rec)
	}
	require.Equal(t, []map[string]any{
		{"level": "INFO", "msg": "asynq", "text": "Starting processing"},
		{"level": "WARN", "msg": "asynq", "text": "Server busy: 3"},
	}, lines)
}
