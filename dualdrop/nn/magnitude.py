"""Former module path of gradual magnitude pruning, kept so that imports and pickled models that
name it still resolve; the code lives in ``dualdrop.nn.methods.magnitude``."""

from dualdrop.nn.methods import magnitude as _moved

globals().update({k: v for k, v in vars(_moved).items() if not k.startswith("__")})
