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


# The run settings (kloop optimize options) each model policy takes; an absent or None one keeps the policy's default
# (its model id included: agent.policies.anthropic.DEFAULT_MODEL).
MODEL_SETTINGS = {
    "anthropic": ("model", "base_url", "thinking", "effort", "max_retries"),
    "openai": ("model", "base_url", "max_retries", "tools"),
}


def model_policy_settings(name: str, settings: dict) -> dict:
    """The keyword arguments for model policy `name` from a run's settings (runs made before a setting existed
    simply lack it).

    >>> model_policy_settings("openai", {"model": "qwen", "tools": False, "thinking": None})
    {'model': 'qwen', 'tools': False}
    """
    return {k: settings[k] for k in MODEL_SETTINGS[name] if settings.get(k) is not None}


def make_policy(name: str, **settings) -> Policy:
    """>>> make_policy("offline", target=load_target("softmax"))"""
    if name not in POLICIES:
        raise PolicyError(f"unknown policy {name!r} (one of {', '.join(POLICIES)})")
    module_name, class_name = POLICIES[name]
    return getattr(importlib.import_module(module_name), class_name)(**settings)
