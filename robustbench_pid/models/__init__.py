"""Model architectures (registered with timm) and the user-facing model zoo.

Importing this package registers our architectures with timm, so ``timm.create_model`` builds
them like any timm model. Each further architecture is one module here.
"""
from ..registry import discover

discover(__name__)  # every module here registers its architectures (timm) and zoo aliases
from .pid_vit import PidGains, PidVisionTransformer
from .wrapper import Normalized
from .zoo import ModelEntry, load_model, resolve_model, zoo

__all__ = ["PidGains", "PidVisionTransformer", "Normalized", "ModelEntry", "load_model", "resolve_model", "zoo"]
