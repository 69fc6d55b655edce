"""``wirehead.manager`` of earlier original releases."""
from wirehead_torch.manager import WireheadManager  # noqa: F401
