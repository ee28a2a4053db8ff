"""OpenAI's Responses API (`POST /v1/responses` and the stored-response routes) on the core:
`spec` declares the body, `request` parses it (items -> messages, tools, text format), `answer`
folds the core's events into output items and typed server-sent events, `output` builds response
objects, `store` keeps finished responses for `previous_response_id`, `api` holds the route logic.
"""
