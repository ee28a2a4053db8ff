"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) on the chat pipeline:
the request becomes chat messages for the chat template, tools become the forced-call grammar,
and the manager's outputs become Anthropic's content blocks and events (docs/agents.md)."""
