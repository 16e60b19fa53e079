"""Google's Gemini API (``generateContent``), whose request and response bodies Vertex AI shares.

``GeminiCodec`` is the format's codec; ``generate_path`` is where a deployment's path is made.
"""

from tollway.providers.gemini.codec import GEMINI_API_MODELS, GeminiCodec, generate_path

__all__ = ["GEMINI_API_MODELS", "GeminiCodec", "generate_path"]
