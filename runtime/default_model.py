"""`runtime.default_model.ensure_default_model`, the name the README gives; the code lives in
`runtime.support.default_model` (python -m runtime.default_model works too)."""

from __future__ import annotations

from runtime.support.default_model import DEFAULT_MODEL_NAME, default_model_dir, ensure_default_model, gguf_path

__all__ = ["DEFAULT_MODEL_NAME", "default_model_dir", "ensure_default_model", "gguf_path"]

if __name__ == "__main__":
    print(ensure_default_model())
