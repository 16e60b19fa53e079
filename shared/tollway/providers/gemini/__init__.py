"""Google's Gemini API (``generateContent``), whose request and response bodies Vertex AI shares.

``GeminiCodec`` is the format's codec and ``VertexGeminiCodec`` its Vertex AI variant (another
path, under ``vertex_base_url``); ``generate_path`` is where a deployment's path is made.
``vertex_auth`` holds the Vertex AI request signer; it is not imported here, as it needs google-auth.
"""

from tollway.providers.gemini.codec import (
    GEMINI_API_MODELS,
    VERTEX_MODELS,
    GeminiCodec,
    VertexGeminiCodec,
    generate_path,
    vertex_base_url,
)

__all__ = ["GEMINI_API_MODELS", "VERTEX_MODELS", "GeminiCodec", "VertexGeminiCodec", "generate_path", "vertex_base_url"]
