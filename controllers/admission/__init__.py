"""Session admission (seed 002): an HTTP proxy that keeps shop sessions completing under a
flash crowd with a page scheduler (a concurrency limit per page class, found by progress-based
regulation) and a session scheduler (new sessions admitted one per interval). See README
"Session admission"."""
