"""The OpenAI-compatible API: request planning (protocol), grammar constraints from
response_format and tools (constraints), tool calls in and out (tool_calls), and the response
renderers (api). Everything here turns OpenAI bodies into native /generate bodies and back."""
