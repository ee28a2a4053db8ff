"""Helpers every process may use that touch the host rather than the model: child-process set-up
and parent watching, the sandboxed worker process, tokenizer loading, grammar validation, the
default model's files. Imports no torch at module level; below it only `runtime.contracts`."""
