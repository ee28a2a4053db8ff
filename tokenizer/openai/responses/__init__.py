"""OpenAI's Responses API (`POST /v1/responses` and the stored-response routes) on top of the
chat pipeline: `protocol` turns a request into a chat request (items -> messages, tools, text
format), `store` keeps finished responses for `previous_response_id`, `output` builds response
objects, `events` streams the typed server-sent events, `api` holds the route logic.
"""
