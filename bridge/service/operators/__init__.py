"""What operators see and do: metrics and /health, `!ask` commands, reminders, set status, and the hooks that wire them in."""
