"""Policies by name. Model policies are imported only when asked for, so the offline path needs no SDK."""
from __future__ import annotations

import importlib

from agent.policy import Policy, PolicyError

# name -> (module, class); each class takes its settings as keyword arguments.
POLICIES = {
    "offline": ("agent.policies.offline", "OfflinePolicy"),
    "anthropic": ("agent.policies.anthropic", "AnthropicPolicy"),
    "openai": ("agent.policies.openai", "OpenAIPolicy"),
    "replay": ("agent.policies.replay", "ReplayPolicy"),
}


def make_policy(name: str, **settings) -> Policy:
    """>>> make_policy("offline", target=load_target("softmax"))"""
    if name not in POLICIES:
        raise PolicyError(f"unknown policy {name!r} (one of {', '.join(POLICIES)})")
    module_name, class_name = POLICIES[name]
    return getattr(importlib.import_module(module_name), class_name)(**settings)
