"""What every protocol shares: field specs, the typed request, its event stream, and the chat,
tool-call and reasoning machinery the answers are folded from."""
