"""``wirehead.dataset`` of the original: the map-style readers and the
normalisation helper."""
from wirehead_torch.dataset import (  # noqa: F401
    MongoheadDataset,
    MongoTupleheadDataset,
    unit_interval_normalize,
)
