"""``wirehead.generator`` of the original: the generator (and its manager)."""
from wirehead_torch.generator import WireheadGenerator  # noqa: F401
from wirehead_torch.manager import WireheadManager  # noqa: F401
