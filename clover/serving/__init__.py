"""OpenAI-compatible serving: engine + scheduler (one thread owns the model), schemas, HTTP app.

    from clover.serving import Runtime, ServerConfig, create_app
    app = create_app(ServerConfig(), lambda metrics: Runtime.from_objects(model, tokenizer, metrics=metrics))
"""

from .admission import ServerConfig
from .app import create_app
from .engine import Engine, EngineConfig
from .runtime import Runtime
from .scheduler import SchedulerConfig

__all__ = ["Engine", "EngineConfig", "Runtime", "SchedulerConfig", "ServerConfig", "create_app"]
