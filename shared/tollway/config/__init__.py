"""``llm-router.yml``: its schema, loading with interpolation, and semantic validation."""

from tollway.config.loader import interpolate, load_config, load_yaml, parse_config
from tollway.config.schema import RouterConfig
from tollway.config.validate import validate

__all__ = ["RouterConfig", "interpolate", "load_config", "load_yaml", "parse_config", "validate"]
