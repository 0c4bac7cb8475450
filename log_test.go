package troupe

import (
	"io"
	"log/slog"
	"os"
)

// quietLogger discards logs unless TROUPE_TEST_LOG is set.
func quietLogger() *slog.Logger {
	if os.Getenv("TROUPE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
