"""SGLang's native API: /generate, abort, tokenize and the server's own routes."""
