"""Test settings shared by every test file.

Hypothesis's "explain" phase re-runs a failing example many times to say which
parts of it matter. Our examples run whole simulated worlds, some with a time
limit, so that phase can take many minutes after a failure: a real bug would
look like a hang. Without it a failing property fails as soon as it is shrunk.
"""

from hypothesis import Phase, settings

settings.register_profile(
    "ringlab", phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink])
settings.load_profile("ringlab")
